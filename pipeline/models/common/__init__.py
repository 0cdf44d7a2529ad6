"""What several model families share (rotary position schemes, settings checks, ...): code of no single family, which
a family imports instead of another family's."""
