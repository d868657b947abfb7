"""One builder per served model: train, export, write the manifest."""
