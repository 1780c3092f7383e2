"""The PySpark data source and the jobs that run on Spark (speaks Kafka protocol only)."""
