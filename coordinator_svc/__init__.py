"""coordinator_svc: transaction coordinators (transactional ids, producer
epochs and fencing, the transaction state machine and its log, markers)."""
