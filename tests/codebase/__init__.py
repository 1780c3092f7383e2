"""The code's own shape: layers, generated protocol stubs."""
