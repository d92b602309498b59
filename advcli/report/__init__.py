"""The bias report and the inspection, and their documents."""
