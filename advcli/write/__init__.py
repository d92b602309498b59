"""Stage 3: the output rows in every format, and publishing them safely."""
