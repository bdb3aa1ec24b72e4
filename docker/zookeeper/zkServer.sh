#!/bin/bash
# The two verbs of the official image's zkServer.sh that txlog's deployments
# use, so this image runs where that one is named (the chart's StatefulSet):
#   zkServer.sh start-foreground   the server (the image's command); $JVMFLAGS
#                                  as the official image takes them
#   zkServer.sh status             exit 0 when the server answers `srvr` with
#                                  its mode (the chart's readiness probe)
set -euo pipefail
case "${1:-}" in
  start-foreground)
    # shellcheck disable=SC2086  # JVMFLAGS is a list of flags
    exec java ${JVMFLAGS:--Xmx256m} -cp /conf:/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar \
      org.apache.zookeeper.server.ZooKeeperServerMain /conf/zoo.cfg
    ;;
  status)
    exec 3<>/dev/tcp/127.0.0.1/2181
    printf srvr >&3
    mode=$(grep -m1 '^Mode: ' <&3 || true)
    if [ -z "$mode" ]; then
      echo "ZooKeeper on 127.0.0.1:2181 did not say its mode" >&2
      exit 1
    fi
    echo "$mode"
    ;;
  *)
    echo "usage: zkServer.sh start-foreground|status" >&2
    exit 2
    ;;
esac
