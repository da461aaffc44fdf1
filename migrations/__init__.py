"""The trace store's SQL migrations, NNNN_name.sql, shipped as package data."""
