"""Stage 2, pure: trajectories, estimators and loss weights over the key projection."""
