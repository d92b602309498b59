"""What the process meets: signals, native code's standard error, standard streams and memory."""
