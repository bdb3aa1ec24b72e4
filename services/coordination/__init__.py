"""How the services find and agree with each other: ZooKeeper, which
coordinator owns what, producer-id blocks, and the inter-service gRPC client."""
