"""What a call's span says it touched, read from the request (txlog/net/telemetry.py)."""

from txlog.net.telemetry import PARTITIONS_SHOWN_MAX, request_attributes
from txlog.v1 import common_pb2, coordinator_pb2, partition_pb2


def test_a_produce_names_its_partitions_topics_and_the_producer_of_its_batches():
    batch = common_pb2.RecordBatch(producer_id=1000, producer_epoch=3, base_sequence=0,
                                   records=[common_pb2.Record(value=b"x")] * 50)
    request = partition_pb2.ProduceRequest(transactional_id="etl-0", batches=[
        partition_pb2.PartitionBatch(topic="orders", partition=p, batch=batch) for p in (2, 0)])
    assert request_attributes(request) == {
        "txlog.transactional_id": "etl-0", "txlog.producer_id": 1000, "txlog.producer_epoch": 3,
        "txlog.partitions": ["orders-2", "orders-0"], "txlog.partition_count": 2, "txlog.topics": ["orders"]}


def test_an_end_txn_names_its_transaction_and_a_big_request_at_most_sixteen_partitions():
    end = coordinator_pb2.EndTxnRequest(transactional_id="t", producer_id=7, producer_epoch=1, committed=True)
    assert request_attributes(end) == {"txlog.transactional_id": "t", "txlog.producer_id": 7, "txlog.producer_epoch": 1}
    fetch = partition_pb2.FetchRequest(partitions=[partition_pb2.FetchPartition(topic=f"t{i % 3}", partition=i) for i in range(40)])
    attributes = request_attributes(fetch)
    assert len(attributes["txlog.partitions"]) == PARTITIONS_SHOWN_MAX and attributes["txlog.partition_count"] == 40
    assert attributes["txlog.topics"] == ["t0", "t1", "t2"]


def test_markers_name_their_transaction_and_partitions():
    request = partition_pb2.WriteTxnMarkersRequest(markers=[partition_pb2.TxnMarker(
        producer_id=8, producer_epoch=1, committed=True, coordinator_epoch=2, transactional_id="t",
        partitions=[common_pb2.TopicPartition(topic="orders", partition=p) for p in (0, 1)])])
    assert request_attributes(request) == {
        "txlog.transactional_id": "t", "txlog.producer_id": 8, "txlog.producer_epoch": 1, "txlog.coordinator_epoch": 2,
        "txlog.partitions": ["orders-0", "orders-1"], "txlog.partition_count": 2, "txlog.topics": ["orders"]}


def test_the_otlp_endpoint_follows_the_standard_variables_unless_one_is_given():
    from txlog.net.telemetry import OTEL_ENDPOINT_DEFAULT, otlp_options

    assert otlp_options(OTEL_ENDPOINT_DEFAULT, {}) == {"endpoint": OTEL_ENDPOINT_DEFAULT, "insecure": True}
    assert otlp_options(OTEL_ENDPOINT_DEFAULT, {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector:4317"}) == {}
    assert otlp_options("https://mine:4317", {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector:4317"}) == {
        "endpoint": "https://mine:4317", "insecure": False}
