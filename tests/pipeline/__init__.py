"""The pipeline (Spark/streams) integration."""
