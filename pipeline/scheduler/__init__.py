"""The scheduler: decides each engine step as plain data; pure, testable without a model."""
