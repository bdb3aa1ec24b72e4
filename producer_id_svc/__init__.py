"""producer_id_svc: hands out disjoint blocks of producer ids, arbitrated by a
conditional update of one ZooKeeper node."""
