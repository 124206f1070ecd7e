"""Generated protobuf code (make proto). Never edit by hand."""
