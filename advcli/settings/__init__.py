"""What decides the numbers: the settings' types and their predicates (``config``), the one
table of estimator rules (``rules``) and the peers' rules as recipes (``recipes``)."""
