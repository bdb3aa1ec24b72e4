"""What every txlog service runs on: the gRPC server and its runtime (health,
reflection, traces, metrics, graceful shutdown), settings from flags and
environment, structured logs, the allocator's tuning."""
