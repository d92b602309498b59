"""Stage 1: reading a dump: inputs, the Parquet and Arrow sources, the trainers' column
names, the roles checked against the values, the key projection and duplicated rows."""
