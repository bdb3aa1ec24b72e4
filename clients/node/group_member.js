#!/usr/bin/env node
// A consumer-group member in Node: node clients/node/group_member.js HOST:PORT[,...] GROUP TOPIC
// Joins GROUP subscribed to TOPIC, heartbeats, reads (read_committed) the
// partitions the coordinator assigns it from where it left off, commits their
// offsets as this member, and on SIGTERM (or SIGINT) leaves the group and
// prints one JSON line: its member id, the values it read per partition, and
// how many commits the coordinator took. Exit status: 0, or 2 on an error.
'use strict';

const txlog = require('./txlog');

async function main() {
  const [bootstrapArg, groupId, topic] = process.argv.slice(2);
  if (!bootstrapArg || !groupId || !topic) {
    process.stderr.write('usage: node group_member.js HOST:PORT[,...] GROUP TOPIC\n');
    return 2;
  }
  const cluster = new txlog.Cluster(bootstrapArg.split(',').map((s) => s.trim()).filter(Boolean));
  const member = new txlog.GroupMember(cluster, groupId, [topic]);
  let stopping = false;
  process.on('SIGTERM', () => { stopping = true; });
  process.on('SIGINT', () => { stopping = true; });
  const positions = new Map(); // "partition" -> next offset
  const read = {};
  let commits = 0;
  while (!stopping) {
    const owned = await member.heartbeat();
    for (const key of [...positions.keys()]) {
      if (!owned.some((tp) => String(tp.partition) === key)) positions.delete(key); // given up
    }
    const committed = [];
    for (const { partition } of owned) {
      const from = positions.get(String(partition)) || 0;
      const result = await txlog.readPartition(cluster, topic, partition, 'ISOLATION_LEVEL_READ_COMMITTED', Date.now() + 300, from);
      for (const record of result.records) (read[partition] = read[partition] || []).push(record.value);
      positions.set(String(partition), result.nextOffset);
      if (result.nextOffset > from) committed.push({ topic, partition, offset: result.nextOffset });
    }
    if (committed.length > 0) {
      await member.commit(committed);
      commits += 1;
    }
    process.stdout.write(JSON.stringify({ event: 'owned', member_id: member.memberId, epoch: member.epoch,
      partitions: member.owned.map((tp) => tp.partition) }) + '\n');
    await new Promise((resolve) => setTimeout(resolve, member.intervalMs));
  }
  await member.leave();
  process.stdout.write(JSON.stringify({ ok: true, member_id: member.memberId, read, commits }) + '\n');
  return 0;
}

main().then((code) => process.exit(code), (err) => {
  process.stderr.write(`error: ${err.stack || err}\n`);
  process.stdout.write(JSON.stringify({ ok: false, error: String(err.message || err) }) + '\n');
  process.exit(2);
});
