"""Tools that drive services on one machine, outside the client install's
use: the local cluster, the chaos tool and the protobuf stub generator.
No service imports them."""
