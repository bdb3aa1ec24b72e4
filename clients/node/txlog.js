// A small txlog client for Node: the repository's protos/ loaded at run time
// (no generated or hand-written message types), errors classified by what the
// servers send (Error.error_class; a failed call's google.rpc.Status, decoded
// with the google/rpc protos in protos/), retries with a deadline, leaders and coordinators looked up and
// forgotten when they move. demo.js uses it.
'use strict';

const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const protobuf = require('protobufjs');

const PROTOS = process.env.TXLOG_PROTOS || path.join(__dirname, '..', '..', 'protos');

// keepCase: field names as in the .proto (producer_id, not producerId).
// longs: String: every int64 (offsets, producer ids) arrives as a decimal
//   string; int64 fields may be sent as strings too.
// defaults: false: a field the server left at its default is ABSENT from the
//   decoded object, not 0/""/false. proto3 never sends zeros, so offset 0,
//   producer epoch 0, an Error with code NONE... all come back as `undefined`:
//   read every number through int() below.
// enums: String: enum values arrive as their names ("NOT_LEADER").
// oneofs: true: a proto3 `optional` field that is set is also named by its
//   synthetic oneof (`_value: "value"`); one that is not set is absent.
const LOAD_OPTIONS = { keepCase: true, longs: String, enums: String, defaults: false, oneofs: true, includeDirs: [PROTOS] };
const definition = protoLoader.loadSync(['txlog/v1/partition.proto', 'txlog/v1/coordinator.proto'], LOAD_OPTIONS);
const v1 = grpc.loadPackageDefinition(definition).txlog.v1;

// An int32/int64 as decoded above: absent means 0 (proto3's default); int64
// strings become numbers, which is exact below 2^53 (refused above it).
function int(value) {
  if (value === undefined || value === null) return 0;
  const n = Number(value);
  if (!Number.isSafeInteger(n)) throw new Error(`integer ${value} is beyond what a JS number holds exactly`);
  return n;
}

// This client relies on issue 20's contract: fields left out mean the safe
// thing (a batch without producer fields is not idempotent, an InitProducerId
// without them names no previous producer, a Produce without acks waits for
// durability, a Fetch/Produce without leader_epoch skips the check). Protos
// from before it had plain proto3 scalars there, where leaving a field out
// sent 0: producer 0 epoch 0 sequence 0, "I am producer 0", acks=0 (no
// acknowledgement). Refuse to run on such protos rather than send that.
// (proto-loader shows a proto3 `optional` field as a synthetic oneof `_name`.)
function hasPresence(messageType, field) {
  const type = definition[`txlog.v1.${messageType}`].type;
  return (type.oneofDecl || []).some((oneof) => oneof.name === `_${field}`);
}
for (const [messageType, field] of [['RecordBatch', 'producer_id'], ['InitProducerIdRequest', 'producer_id'],
  ['ProduceRequest', 'acks'], ['PartitionBatch', 'leader_epoch'], ['FetchPartition', 'leader_epoch']]) {
  if (!hasPresence(messageType, field)) {
    throw new Error(`${PROTOS}: ${messageType}.${field} is not proto3 optional; these protos predate the contract this client is written for`);
  }
}

// --- errors -----------------------------------------------------------------------------

// ErrorCode value names carry the ERROR_CODE_ prefix (buf's style); this client,
// like the servers' messages and ErrorInfo.reason, names codes without it.
const ERROR_CODE_PREFIX = 'ERROR_CODE_';
const shortCode = (name) => String(name).replace(ERROR_CODE_PREFIX, '');

function className(protoName) { // ERROR_CLASS_RETRIABLE -> retriable
  return protoName ? String(protoName).replace(/^ERROR_CLASS_/, '').toLowerCase() : undefined;
}

class TxlogError extends Error {
  constructor(code, message, errorClass, retryDelayMs) {
    super(`${code}: ${message || ''}`);
    this.code = code;
    this.errorClass = errorClass || 'retriable';
    this.retryDelayMs = retryDelayMs;
  }
  get retriable() { return this.errorClass === 'retriable'; }
}

// A per-item outcome (txlog.v1.Error in a result). Success is an ABSENT error
// (the servers set it only on failure) or one whose code is NONE, which with
// defaults: false also arrives as an absent code. The class travels in the
// message (error_class). With enums: String a code this client's protos do not
// know (a newer server's) stays a number, and errors.proto says it is then
// retriable whatever error_class says.
function checkItem(error, what) {
  if (!error || error.code === undefined || error.code === `${ERROR_CODE_PREFIX}NONE` || error.code === 0) return;
  const known = typeof error.code === 'string';
  throw new TxlogError(known ? shortCode(error.code) : `UNKNOWN_CODE_${error.code}`, `${what}: ${error.message || ''}`,
    known ? className(error.error_class) : 'retriable');
}

// google.rpc.Status and its details, from the google/rpc protos that ship in
// protos/ (proto-loader returns service definitions only, so they are read with
// protobufjs, the library proto-loader is built on; it bundles google/protobuf).
const RPC = (() => {
  const root = new protobuf.Root();
  root.resolvePath = (origin, target) => path.join(PROTOS, target);
  root.loadSync(['google/rpc/status.proto', 'google/rpc/error_details.proto'], { keepCase: true });
  return {
    Status: root.lookupType('google.rpc.Status'),
    ErrorInfo: root.lookupType('google.rpc.ErrorInfo'),
    RetryInfo: root.lookupType('google.rpc.RetryInfo'),
  };
})();

// The ErrorInfo and RetryInfo delay (ms) a failed call carries in its
// grpc-status-details-bin trailer, if any.
function statusDetails(err) {
  const raw = err.metadata && err.metadata.get('grpc-status-details-bin')[0];
  if (!raw) return {};
  const found = {};
  for (const any of RPC.Status.decode(raw).details) {
    const typeName = any.type_url.slice(any.type_url.lastIndexOf('/') + 1);
    if (typeName === 'google.rpc.ErrorInfo') found.info = RPC.ErrorInfo.decode(any.value);
    if (typeName === 'google.rpc.RetryInfo') {
      const delay = RPC.RetryInfo.decode(any.value).retry_delay || {};
      found.retryDelayMs = int(delay.seconds) * 1000 + Math.floor((delay.nanos || 0) / 1e6);
    }
  }
  return found;
}

// A failed call. Our servers answer with an ErrorInfo (domain txlog.v1, reason =
// the code's name, metadata.class) and, when retriable, a RetryInfo; the status
// message is "<code name>: <what was wrong>". Plain gRPC failures (server down,
// deadline passed) carry none of it and are sorted by their status code.
const GRPC_RETRIABLE = new Set([grpc.status.UNAVAILABLE, grpc.status.DEADLINE_EXCEEDED, grpc.status.CANCELLED,
  grpc.status.RESOURCE_EXHAUSTED]);
function fromCallError(err, what) {
  if (err instanceof TxlogError) return err;
  if (err.code === undefined) return err; // a bug of ours, not a gRPC failure
  const { info, retryDelayMs } = statusDetails(err);
  if (info && info.domain === 'txlog.v1') {
    const prefix = `${info.reason}: `;
    const message = (err.details || '').startsWith(prefix) ? err.details.slice(prefix.length) : err.details;
    return new TxlogError(info.reason, `${what}: ${message}`, info.metadata.class, retryDelayMs);
  }
  const status = Object.keys(grpc.status).find((k) => grpc.status[k] === err.code) || String(err.code);
  return new TxlogError(`GRPC_${status}`, `${what}: ${err.details}`, GRPC_RETRIABLE.has(err.code) ? 'retriable' : 'fatal');
}

// --- calls and retries ----------------------------------------------------------------------

const CALL_TIMEOUT_MS = 10000;
const RETRY_DEADLINE_MS = Number(process.env.TXLOG_RETRY_DEADLINE_MS || 30000);
const retryCounts = {}; // code -> how many times it was retried (reported by the demo)
// code -> its class and the delay the server's RetryInfo asked for, as last decoded
const retriedErrors = {};

function unary(client, method, request, timeoutMs = CALL_TIMEOUT_MS) {
  return new Promise((resolve, reject) => {
    client[method](request, { deadline: Date.now() + timeoutMs }, (err, reply) => (err ? reject(err) : resolve(reply)));
  });
}

// A server-streaming call: every response in order, or the call's error (which
// says how many responses came before it, in `responsesBefore`).
function streamed(client, method, request, timeoutMs = CALL_TIMEOUT_MS) {
  return new Promise((resolve, reject) => {
    const responses = [];
    const call = client[method](request, { deadline: Date.now() + timeoutMs });
    call.on('data', (response) => responses.push(response));
    call.on('error', (err) => { err.responsesBefore = responses.length; reject(err); });
    call.on('end', () => resolve(responses));
  });
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Runs `attempt` until it succeeds, a non-retriable error, or the deadline;
// `onRetriable(err)` forgets what the error says is stale (a leader, a coordinator).
async function retrying(what, attempt, onRetriable = () => {}) {
  const deadline = Date.now() + RETRY_DEADLINE_MS;
  let backoffMs = 50;
  for (;;) {
    try {
      return await attempt();
    } catch (raw) {
      const err = fromCallError(raw, what);
      if (!(err instanceof TxlogError) || !err.retriable || Date.now() + backoffMs > deadline) throw err;
      retryCounts[err.code] = (retryCounts[err.code] || 0) + 1;
      retriedErrors[err.code] = { class: err.errorClass, retry_delay_ms: err.retryDelayMs };
      process.stderr.write(`txlog: retrying after ${err.message}\n`);
      onRetriable(err);
      // back off, then ask again (the retriable codes are all "try again
      // shortly"): as long as the server's RetryInfo asks, else exponentially
      await sleep(err.retryDelayMs !== undefined ? Math.max(err.retryDelayMs, backoffMs) : backoffMs);
      backoffMs = Math.min(backoffMs * 2, 1000);
    }
  }
}

// --- the cluster: bootstrap, metadata, leaders, coordinators ----------------------------------

class Cluster {
  constructor(bootstrap) {
    this.bootstrap = bootstrap; // partition_svc addresses
    this.clients = new Map();
    this.leaders = new Map(); // "topic/partition" -> {address, leaderId, leaderEpoch}
    this.coordinators = new Map(); // transactional id -> address
  }

  client(kind, address) {
    const key = `${kind}@${address}`;
    if (!this.clients.has(key)) this.clients.set(key, new v1[kind](address, grpc.credentials.createInsecure()));
    return this.clients.get(key);
  }

  partitionSvc(address) { return this.client('PartitionService', address); }

  coordinatorSvc(address) { return this.client('CoordinatorService', address); }

  // A call any partition_svc answers (Metadata, FindCoordinator, InitProducerId
  // without a transactional id): each bootstrap address in turn until one does.
  async anyBootstrap(kind, method, request) {
    let failure;
    for (const address of this.bootstrap) {
      try {
        return await unary(this.client(kind, address), method, request);
      } catch (err) {
        failure = err;
      }
    }
    throw failure;
  }

  metadata(request) { return this.anyBootstrap('PartitionService', 'Metadata', request); }

  // Every partition of a topic with its leader (per-partition errors such as
  // LEADER_NOT_AVAILABLE and a missing topic, UNKNOWN_TOPIC_OR_PARTITION, are
  // retriable: the topic may still be being created, a leader restarting).
  async describeTopic(topic) {
    return retrying(`Metadata ${topic}`, async () => {
      const reply = await this.metadata({ topics: [topic] });
      const found = (reply.topics || [])[0];
      if (!found) throw new TxlogError('UNKNOWN_TOPIC_OR_PARTITION', `no metadata for ${topic}`);
      checkItem(found.error, `topic ${topic}`);
      return (found.partitions || []).map((p) => {
        checkItem(p.error, `${topic}-${int(p.partition)}`);
        const leader = { partition: int(p.partition), address: p.leader_address, leaderId: int(p.leader_id), leaderEpoch: int(p.leader_epoch) };
        this.leaders.set(`${topic}/${leader.partition}`, leader);
        return leader;
      });
    });
  }

  async leader(topic, partition) {
    const key = `${topic}/${partition}`;
    if (!this.leaders.has(key)) await this.describeTopic(topic);
    const leader = this.leaders.get(key);
    if (!leader) throw new TxlogError('UNKNOWN_TOPIC_OR_PARTITION', `${topic} has no partition ${partition}`);
    return leader;
  }

  forgetLeader(topic, partition) { this.leaders.delete(`${topic}/${partition}`); }

  // The coordinator of a transactional id: FindCoordinator at any partition_svc.
  async coordinator(transactionalId) {
    if (!this.coordinators.has(transactionalId)) {
      const found = await retrying(`FindCoordinator ${transactionalId}`, () => this.anyBootstrap('CoordinatorService',
        'FindCoordinator', { key: transactionalId, key_type: 'COORDINATOR_KEY_TYPE_TRANSACTION' }));
      this.coordinators.set(transactionalId, found.address);
    }
    return this.coordinators.get(transactionalId);
  }

  forgetCoordinator(transactionalId) { this.coordinators.delete(transactionalId); }

  close() {
    for (const client of this.clients.values()) client.close();
  }
}

// Errors after which the cached leader or coordinator is stale.
const LEADER_MOVED = new Set(['NOT_LEADER', 'LEADER_NOT_AVAILABLE', 'FENCED_LEADER_EPOCH', 'UNKNOWN_LEADER_EPOCH',
  'UNKNOWN_TOPIC_OR_PARTITION', 'GRPC_UNAVAILABLE']);
const COORDINATOR_MOVED = new Set(['NOT_COORDINATOR', 'COORDINATOR_NOT_AVAILABLE', 'GRPC_UNAVAILABLE']);

// --- producing ---------------------------------------------------------------------------------

// Sequences are int32 and wrap to 0 after 2^31-1 (common.proto).
const nextSequence = (sequence, records) => (sequence + records) % 2 ** 31;

// A RecordBatch. `producer` is {producerId, producerEpoch, baseSequence} for an
// idempotent or transactional batch: all three are set, always (setting only
// some is INVALID_REQUEST). Careful: with defaults: false an epoch 0 answered
// by InitProducerId arrives as `undefined`, and an undefined field is simply
// not sent, so copy epochs through int() (0 set explicitly IS sent, these
// fields being optional). Without `producer` the three are left out: a plain,
// non-idempotent batch. Record timestamps are left out too: the leader stamps
// its append time.
function recordBatch(values, producer, transactional = false) {
  const batch = { records: values.map((v) => ({ value: Buffer.from(v) })) };
  if (producer) {
    batch.producer_id = String(producer.producerId);
    batch.producer_epoch = int(producer.producerEpoch);
    batch.base_sequence = int(producer.baseSequence);
    batch.is_transactional = transactional;
  }
  return batch;
}

// --- the encoded batch format (docs/guides/batch-format.md) --------------------------------------

// CRC32C (Castagnoli, reflected polynomial 0x82F63B78), a byte at a time from a table.
const CRC32C_TABLE = (() => {
  const table = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0x82F63B78 : c >>> 1;
    table[n] = c >>> 0;
  }
  return table;
})();
function crc32c(buffer) {
  let crc = 0xFFFFFFFF;
  for (let i = 0; i < buffer.length; i++) crc = CRC32C_TABLE[(crc ^ buffer[i]) & 0xFF] ^ (crc >>> 8);
  return (crc ^ 0xFFFFFFFF) >>> 0;
}

function varint(n) {
  const out = [];
  while (n > 0x7F) { out.push((n & 0x7F) | 0x80); n = Math.floor(n / 128); }
  out.push(n);
  return Buffer.from(out);
}
// A length-delimited protobuf field: its tag byte, its length, its bytes.
function delimited(tag, bytes) { return Buffer.concat([Buffer.from([tag]), varint(bytes.length), bytes]); }

const HEADER_BYTES = 53;
const CRC_END = 25;
const TRANSACTIONAL = 0x10;
const UNTIMED_RECORDS = 0x08;
const RECORDS_TAG = 8 << 3 | 2; // RecordBatch.records
const VALUE_TAG = 4 << 3 | 2; // Record.value

// One batch in the encoded form: the 53-byte header (the leader's fields left
// 0/-1/0, the CRC over bytes 25..), then a serialized RecordBatch holding only
// the records (their value only: no key, and timestamp 0, which takes the
// leader's append time). `producer` as recordBatch's; without it, -1s.
function encodeBatch(values, producer, transactional = false) {
  const records = Buffer.concat(values.map((v) => delimited(RECORDS_TAG, delimited(VALUE_TAG, Buffer.from(v)))));
  const covered = Buffer.alloc(HEADER_BYTES - CRC_END);
  covered.writeInt16BE(UNTIMED_RECORDS | (transactional ? TRANSACTIONAL : 0), 0);
  covered.writeInt32BE(values.length - 1, 2); // last_offset_delta
  covered.writeBigInt64BE(0n, 6); // max_timestamp_ms: no record carries one
  covered.writeBigInt64BE(producer ? BigInt(producer.producerId) : -1n, 14);
  covered.writeInt16BE(producer ? int(producer.producerEpoch) : -1, 22);
  covered.writeInt32BE(producer ? int(producer.baseSequence) : -1, 24);
  const head = Buffer.alloc(CRC_END);
  head.writeBigInt64BE(0n, 0); // base_offset: the leader's
  head.writeInt32BE(-1, 8); // partition_leader_epoch: the leader's
  head.writeBigInt64BE(0n, 12); // log_append_time_ms: the leader's
  head.writeInt8(2, 20); // magic
  head.writeUInt32BE(crc32c(Buffer.concat([covered, records])), 21);
  return Buffer.concat([head, covered, records]);
}

function safeNumber(big, what) {
  const n = Number(big);
  if (!Number.isSafeInteger(n)) throw new Error(`${what} ${big} is beyond what a JS number holds exactly`);
  return n;
}

// A fetched encoded batch: its header and its records with offsets and
// timestamps. A damaged batch (CRC mismatch) or a compressed one (this client
// lists no codec in accepted_compressions, so the leader never sends one) throws.
function decodeBatch(buffer) {
  if (buffer.length <= HEADER_BYTES || buffer.readInt8(20) !== 2) throw new Error('not an encoded batch (length or magic)');
  const crc = buffer.readUInt32BE(21);
  if (crc32c(buffer.subarray(CRC_END)) !== crc) {
    throw new TxlogError('CORRUPT_MESSAGE', `a fetched batch's CRC32C ${crc} does not match its bytes`, 'retriable');
  }
  const attributes = buffer.readInt16BE(25);
  if (attributes & 0x07) throw new Error(`a compressed batch (codec ${attributes & 0x07}) this client did not ask for`);
  const header = {
    baseOffset: safeNumber(buffer.readBigInt64BE(0), 'base_offset'),
    logAppendTimeMs: safeNumber(buffer.readBigInt64BE(12), 'log_append_time_ms'),
    producerId: safeNumber(buffer.readBigInt64BE(39), 'producer_id'),
    transactional: !!(attributes & TRANSACTIONAL),
  };
  const reader = protobuf.Reader.create(buffer.subarray(HEADER_BYTES));
  const records = [];
  while (reader.pos < reader.len) {
    const tag = reader.uint32();
    if (tag !== RECORDS_TAG) { reader.skipType(tag & 7); continue; }
    const end = reader.uint32() + reader.pos;
    const record = { offset: header.baseOffset + records.length, timestampMs: header.logAppendTimeMs, key: null, value: null };
    while (reader.pos < end) {
      const field = reader.uint32();
      if (field === (2 << 3)) record.timestampMs = safeNumber(reader.int64().toString(), 'timestamp_ms') || header.logAppendTimeMs;
      else if (field === (3 << 3 | 2)) record.key = Buffer.from(reader.bytes());
      else if (field === VALUE_TAG) record.value = Buffer.from(reader.bytes());
      else reader.skipType(field & 7);
    }
    records.push(record);
  }
  return { ...header, records };
}

// Produces one batch to one partition's leader, retrying retriable errors
// (after a leader change, to the new leader). Re-sending the same batch is
// safe for idempotent batches: the leader answers a duplicate with its
// original offset and appends nothing.
async function produce(cluster, topic, partition, batch, transactionalId) {
  return retrying(`Produce ${topic}-${partition}`, async () => {
    const leader = await cluster.leader(topic, partition);
    // leader_epoch: the one metadata showed, so a deposed leader refuses the
    // batch (FENCED_LEADER_EPOCH, retriable) instead of taking it.
    // acks is left out: absent means all (-1), the answer comes once the batch
    // is durable and carries its offset (acks=0 would answer base_offset -1).
    // A Buffer is a batch in the encoded form (encodeBatch), anything else a RecordBatch message (recordBatch).
    const item = Buffer.isBuffer(batch) ? { encoded_batch: batch } : { batch };
    const request = { batches: [{ topic, partition, leader_epoch: leader.leaderEpoch, ...item }] };
    if (transactionalId) request.transactional_id = transactionalId; // transactional batches need it
    const reply = await unary(cluster.partitionSvc(leader.address), 'Produce', request);
    const result = (reply.results || [])[0];
    if (!result) throw new TxlogError('UNKNOWN_SERVER_ERROR', 'Produce answered no result', 'fatal');
    checkItem(result.error, `Produce ${topic}-${partition}`);
    return { baseOffset: int(result.base_offset), leaderId: leader.leaderId };
  }, (err) => { if (LEADER_MOVED.has(err.code)) cluster.forgetLeader(topic, partition); });
}

// InitProducerId without a transactional id: any partition_svc answers it with
// a new producer id at epoch 0 (absent from the reply: read through int()).
// producer_id/producer_epoch are left out: no previous producer.
async function initIdempotent(cluster) {
  const reply = await retrying('InitProducerId (idempotent)', () => cluster.anyBootstrap('CoordinatorService', 'InitProducerId', {}));
  return { producerId: reply.producer_id || '0', producerEpoch: int(reply.producer_epoch) };
}

// A transactional producer: the coordinator's side of a transaction
// (InitProducerId, AddPartitionsToTxn, EndTxn) and its batches.
class TransactionalProducer {
  constructor(cluster, transactionalId, transactionTimeoutMs = 60000) {
    this.cluster = cluster;
    this.transactionalId = transactionalId;
    this.transactionTimeoutMs = transactionTimeoutMs;
    this.producerId = undefined; // int64 as a string
    this.producerEpoch = undefined;
    this.sequences = new Map(); // "topic/partition" -> next base sequence, per epoch
  }

  // A call to the id's coordinator; NOT_COORDINATOR and friends: find it again.
  // CONCURRENT_TRANSACTIONS (the previous transaction is still completing, or
  // an older incarnation is being fenced) and COORDINATOR_LOAD_IN_PROGRESS: retry.
  coordinatorCall(method, request, check = () => {}) {
    return retrying(`${method} ${this.transactionalId}`, async () => {
      const address = await this.cluster.coordinator(this.transactionalId);
      const reply = await unary(this.cluster.coordinatorSvc(address), method, request);
      check(reply);
      return reply;
    }, (err) => { if (COORDINATOR_MOVED.has(err.code)) this.cluster.forgetCoordinator(this.transactionalId); });
  }

  // Registers the id: a producer id and epoch, fencing any older producer
  // with the same id (whose open transaction the coordinator aborts while we
  // get CONCURRENT_TRANSACTIONS). No previous producer: its fields left out.
  async init() {
    const request = { transactional_id: this.transactionalId, transaction_timeout_ms: this.transactionTimeoutMs };
    const reply = await this.coordinatorCall('InitProducerId', request);
    this.startEpoch(reply);
    return { producerId: this.producerId, producerEpoch: this.producerEpoch };
  }

  // A new epoch (from InitProducerId or EndTxn) starts every partition at sequence 0.
  startEpoch(reply) {
    this.producerId = reply.producer_id || '0';
    this.producerEpoch = int(reply.producer_epoch);
    this.sequences.clear();
  }

  // One transaction: AddPartitionsToTxn for every partition first (a leader
  // refuses a transactional batch for a partition the coordinator has not
  // recorded: INVALID_TXN_STATE), then the batches, then EndTxn. EndTxn
  // answers once the outcome is decided, before the markers are written, with
  // the bumped epoch the next transaction must use (Transactions V2).
  async transaction(topic, valuesByPartition, commit) {
    const partitions = Object.keys(valuesByPartition).map(Number);
    const epochUsed = this.producerEpoch;
    const base = { transactional_id: this.transactionalId, producer_id: this.producerId, producer_epoch: this.producerEpoch };
    const produced = {};
    try {
      await this.coordinatorCall('AddPartitionsToTxn', { ...base, partitions: partitions.map((partition) => ({ topic, partition })) },
        (reply) => {
          const results = reply.results || [];
          if (results.length !== partitions.length) throw new TxlogError('UNKNOWN_SERVER_ERROR', 'AddPartitionsToTxn: wrong result count', 'fatal');
          for (const r of results) checkItem(r.error, `AddPartitionsToTxn ${r.partition.topic}-${int(r.partition.partition)}`);
        });
      await Promise.all(partitions.map(async (partition) => { // two leaders, two requests, in parallel
        const values = valuesByPartition[partition];
        const key = `${topic}/${partition}`;
        const baseSequence = this.sequences.get(key) || 0;
        const batch = encodeBatch(values, { producerId: this.producerId, producerEpoch: this.producerEpoch, baseSequence }, true);
        const { baseOffset, leaderId } = await produce(this.cluster, topic, partition, batch, this.transactionalId);
        this.sequences.set(key, nextSequence(baseSequence, values.length));
        produced[partition] = { leader_id: leaderId, base_offset: baseOffset, base_sequence: baseSequence, values };
      }));
    } catch (err) {
      // Abortable (INVALID_TXN_STATE, OUT_OF_ORDER_SEQUENCE, ...): this
      // transaction can never commit; abort it now rather than let it hold the
      // partitions' last stable offset until its timeout, then report. Fatal
      // (PRODUCER_FENCED: another producer has the id): nothing more to send.
      if (err instanceof TxlogError && err.errorClass === 'abortable') {
        try {
          this.startEpoch(await this.coordinatorCall('EndTxn', { ...base, committed: false }));
          err.message += ' (the transaction was aborted)';
        } catch (abortErr) {
          err.message += ` (and its abort failed: ${abortErr.message})`;
        }
      }
      throw err;
    }
    const ended = await this.coordinatorCall('EndTxn', { ...base, committed: commit });
    this.startEpoch(ended);
    return { committed: commit, producer_id: base.producer_id, epoch_used: epochUsed,
      epoch_after: this.producerEpoch, producer_id_after: this.producerId, partitions: produced };
  }
}

// --- fetching ----------------------------------------------------------------------------------

// Reads a partition from `fromOffset` until everything there is has been read
// and no transaction is open on it (last stable offset == high watermark), or
// until `deadline` (ms since the epoch). Long-polls, so it never spins.
// Answers {records: [{offset, value, producer_id, transactional}], highWatermark,
// lastStableOffset, settled}.
// Addresses of servers older than FetchStream (UNIMPLEMENTED before any chunk): Fetch there.
const withoutFetchStream = new Set();

// A Fetch's answer as FetchStream's chunks (each laid out as a FetchResponse,
// each continuing where the one before left off), or a Fetch's one response.
async function fetchResponses(cluster, address, fetch) {
  if (!withoutFetchStream.has(address)) {
    try {
      return await streamed(cluster.partitionSvc(address), 'FetchStream', { fetch });
    } catch (err) {
      if (err.code !== grpc.status.UNIMPLEMENTED || err.responsesBefore) throw err;
      withoutFetchStream.add(address);
    }
  }
  return [await unary(cluster.partitionSvc(address), 'Fetch', fetch)];
}

async function readPartition(cluster, topic, partition, isolation, deadline, fromOffset = 0) {
  const records = [];
  let offset = fromOffset;
  for (;;) {
    const results = await retrying(`Fetch ${topic}-${partition}`, async () => {
      const leader = await cluster.leader(topic, partition);
      const responses = await fetchResponses(cluster, leader.address, {
        isolation_level: isolation,
        batch_format: 'BATCH_FORMAT_ENCODED', // whole batches as stored, in encoded_batches (an older server sends batches)
        max_wait_ms: 200,
        partitions: [{ topic, partition, fetch_offset: String(offset), leader_epoch: leader.leaderEpoch }],
      });
      return responses.map((reply) => {
        const item = (reply.results || [])[0];
        if (!item) throw new TxlogError('UNKNOWN_SERVER_ERROR', 'Fetch answered no result', 'fatal');
        checkItem(item.error, `Fetch ${topic}-${partition}`);
        return item;
      });
    }, (err) => { if (LEADER_MOVED.has(err.code)) cluster.forgetLeader(topic, partition); });
    for (const result of results) {
      for (const batch of result.batches || []) {
        for (const record of batch.records || []) {
          records.push({ offset: int(record.offset), value: record.value ? record.value.toString() : null,
            producer_id: batch.producer_id === undefined ? null : int(batch.producer_id), transactional: !!batch.is_transactional });
        }
      }
      for (const encoded of result.encoded_batches || []) {
        const batch = decodeBatch(encoded);
        for (const record of batch.records) {
          if (record.offset < offset) continue; // a batch comes whole: the records below the fetch offset are skipped here
          records.push({ offset: record.offset, value: record.value ? record.value.toString() : null,
            producer_id: batch.producerId, transactional: batch.transactional });
        }
      }
      // next_fetch_offset skips markers and (read_committed) aborted batches;
      // absent means 0 like every other int64 here.
      offset = Math.max(offset, int(result.next_fetch_offset));
    }
    const result = results[results.length - 1];
    const highWatermark = int(result.high_watermark);
    const lastStable = int(result.last_stable_offset);
    const settled = lastStable === highWatermark && offset >= highWatermark;
    if (settled || Date.now() >= deadline) {
      return { records, highWatermark, lastStableOffset: lastStable, nextOffset: offset, settled };
    }
  }
}

// --- consumer groups (KIP-848): the coordinator assigns, the member follows ------------------

const REJOIN = new Set(['FENCED_MEMBER_EPOCH', 'UNKNOWN_MEMBER_ID']);

// One member of a consumer group. Each heartbeat says what it owns; the answer
// is everything it may own now: partitions missing from it are given up at once
// (this member holds no uncommitted work across heartbeats), new ones taken.
class GroupMember {
  constructor(cluster, groupId, topics) {
    this.cluster = cluster;
    this.groupId = groupId;
    this.topics = topics;
    this.memberId = require('crypto').randomUUID(); // made here and kept across rejoins (KIP-1082)
    this.epoch = 0;
    this.owned = []; // [{topic, partition}]
    this.intervalMs = 200;
  }

  async coordinatorAddress() {
    const reply = await this.cluster.metadata({ group_ids: [this.groupId] });
    const found = (reply.group_coordinators || [])[0];
    if (!found) throw new TxlogError('COORDINATOR_NOT_AVAILABLE', `no coordinator for group ${this.groupId}`);
    checkItem(found.error, `group ${this.groupId}`);
    return found.address;
  }

  async heartbeat() {
    const request = {
      group_id: this.groupId, member_id: this.memberId, member_epoch: this.epoch,
      owned_partitions: { partitions: this.owned },
    };
    if (this.epoch === 0) request.subscribed_topics = { names: this.topics };
    try {
      const reply = await retrying(`ConsumerGroupHeartbeat ${this.groupId}`, async () =>
        unary(this.cluster.partitionSvc(await this.coordinatorAddress()), 'ConsumerGroupHeartbeat', request));
      this.epoch = int(reply.member_epoch);
      this.intervalMs = Math.min(int(reply.heartbeat_interval_ms) || 200, 1000);
      this.owned = ((reply.assignment || {}).partitions || []).map((tp) => ({ topic: tp.topic, partition: int(tp.partition) }));
    } catch (err) {
      if (!(err instanceof TxlogError) || !REJOIN.has(err.code)) throw err;
      this.epoch = 0; // the group moved on without us: drop everything, rejoin as ourselves
      this.owned = [];
    }
    return this.owned;
  }

  // Commits next-offsets for owned partitions, as this member (refused if it was fenced).
  async commit(offsets) {
    const reply = await unary(this.cluster.partitionSvc(await this.coordinatorAddress()), 'OffsetCommit', {
      group_id: this.groupId, member_id: this.memberId, member_epoch: this.epoch,
      offsets: offsets.map(({ topic, partition, offset }) => ({ topic, partition, offset: String(offset) })),
    });
    for (const result of reply.results || []) checkItem(result.error, `OffsetCommit ${this.groupId}`);
  }

  async leave() {
    if (this.epoch <= 0) return;
    await unary(this.cluster.partitionSvc(await this.coordinatorAddress()), 'ConsumerGroupHeartbeat',
      { group_id: this.groupId, member_id: this.memberId, member_epoch: -1 });
    this.epoch = -1;
    this.owned = [];
  }
}

module.exports = {
  v1, definition, int, retryCounts, retriedErrors,
  TxlogError, checkItem, fromCallError, retrying, unary, Cluster,
  recordBatch, encodeBatch, decodeBatch, crc32c, produce, initIdempotent, nextSequence, TransactionalProducer, readPartition,
  GroupMember,
};
