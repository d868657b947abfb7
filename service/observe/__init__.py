"""What the service tells its operators: Prometheus metrics (``metrics``), spans and their export
(``spans``, ``tracing``), log lines (``logs``) and the event loop's lag (``loop_lag``)."""
