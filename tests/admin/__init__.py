"""Topic administration APIs: create/delete/describe topics, configs."""
