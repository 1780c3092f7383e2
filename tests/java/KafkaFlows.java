// The Java client's flows against a broker, for tests/interop/test_java_client.py: each flow
// prints one fact per line ("word value ...") for the test to check, and exits non-zero
// with the exception on stderr when the client fails.
//
//   java KafkaFlows admin BOOTSTRAP TOPIC PARTITIONS
//   java KafkaFlows produce BOOTSTRAP TOPIC COUNT
//   java KafkaFlows group BOOTSTRAP TOPIC GROUP COUNT
//   java KafkaFlows transactions BOOTSTRAP TOPIC TRANSACTIONAL_ID GROUP
//   java KafkaFlows failover BOOTSTRAP TOPIC PARTITIONS COUNT
//   java KafkaFlows quotas BOOTSTRAP USER TENANT
//   java KafkaFlows abort BOOTSTRAP TOPIC TRANSACTIONAL_ID
//   java KafkaFlows replicas BOOTSTRAP TOPIC

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ExecutionException;

import org.apache.kafka.clients.admin.AbortTransactionSpec;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterClientQuotasOptions;
import org.apache.kafka.clients.admin.NewPartitionReassignment;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.ProducerState;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicCollection;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.TopicPartitionReplica;
import org.apache.kafka.common.quota.ClientQuotaAlteration;
import org.apache.kafka.common.quota.ClientQuotaEntity;
import org.apache.kafka.common.quota.ClientQuotaFilter;
import org.apache.kafka.common.quota.ClientQuotaFilterComponent;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public final class KafkaFlows {
    private static final Duration POLL = Duration.ofMillis(200);
    private static final long DEADLINE_MS = 30_000;

    private KafkaFlows() {
    }

    public static void main(String[] args) throws Exception {
        switch (args[0]) {
            case "admin" -> admin(args[1], args[2], Integer.parseInt(args[3]));
            case "produce" -> produce(args[1], args[2], Integer.parseInt(args[3]));
            case "group" -> group(args[1], args[2], args[3], Integer.parseInt(args[4]));
            case "transactions" -> transactions(args[1], args[2], args[3], args[4]);
            case "failover" -> failover(args[1], args[2], Integer.parseInt(args[3]),
                Integer.parseInt(args[4]));
            case "quotas" -> quotas(args[1], args[2], args[3]);
            case "abort" -> abort(args[1], args[2], args[3]);
            case "replicas" -> replicas(args[1], args[2]);
            default -> throw new IllegalArgumentException("unknown flow " + args[0]);
        }
    }

    private static Properties common(String bootstrap) {
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        props.put("client.id", "java-flows");
        return props;
    }

    /**
     * The kafka-configs flow for client quotas: alterClientQuotas sets producer_byte_rate of
     * a user and of a tenant (our own entity type, sent as the client is given it), then
     * describeClientQuotas reads each back; an unknown key, a negative value and a
     * validate-only change are answered and change nothing; removing a key removes it.
     */
    private static void quotas(String bootstrap, String user, String tenant) throws Exception {
        ClientQuotaEntity userEntity = new ClientQuotaEntity(Map.of(ClientQuotaEntity.USER, user));
        ClientQuotaEntity tenantEntity = new ClientQuotaEntity(Map.of("tenant", tenant));
        try (Admin admin = Admin.create(common(bootstrap))) {
            admin.alterClientQuotas(List.of(
                new ClientQuotaAlteration(userEntity, List.of(
                    new ClientQuotaAlteration.Op("producer_byte_rate", 1048576.0))),
                new ClientQuotaAlteration(tenantEntity, List.of(
                    new ClientQuotaAlteration.Op("producer_byte_rate", 2097152.0))))).all().get();
            System.out.println("altered 2");
            describeQuotas(admin, "user", ClientQuotaEntity.USER, user);
            describeQuotas(admin, "tenant", "tenant", tenant);
            for (String[] bad : new String[][] {
                    {"unknown-key", "no_such_quota", "5"}, {"negative", "producer_byte_rate", "-1"}}) {
                try {
                    admin.alterClientQuotas(List.of(new ClientQuotaAlteration(userEntity, List.of(
                        new ClientQuotaAlteration.Op(bad[1], Double.parseDouble(bad[2])))))).all().get();
                    System.out.println("accepted " + bad[0]);
                } catch (ExecutionException e) {
                    System.out.println("refused " + bad[0] + " " + e.getCause().getClass().getSimpleName());
                }
            }
            admin.alterClientQuotas(List.of(new ClientQuotaAlteration(userEntity, List.of(
                    new ClientQuotaAlteration.Op("consumer_byte_rate", 5000.0)))),
                new AlterClientQuotasOptions().validateOnly(true)).all().get();
            System.out.println("validated-only");
            describeQuotas(admin, "user", ClientQuotaEntity.USER, user);
            admin.alterClientQuotas(List.of(new ClientQuotaAlteration(userEntity, List.of(
                new ClientQuotaAlteration.Op("producer_byte_rate", null))))).all().get();
            System.out.println("removed");
            describeQuotas(admin, "user", ClientQuotaEntity.USER, user);
        }
    }

    /** Print "described LABEL KEY VALUE ..." of the quotas of one entity (exact match). */
    private static void describeQuotas(Admin admin, String label, String type, String name)
            throws Exception {
        Map<ClientQuotaEntity, Map<String, Double>> found = admin.describeClientQuotas(
            ClientQuotaFilter.containsOnly(List.of(ClientQuotaFilterComponent.ofEntity(type, name))))
            .entities().get();
        StringBuilder line = new StringBuilder("described " + label + " " + found.size());
        for (Map.Entry<ClientQuotaEntity, Map<String, Double>> entity : found.entrySet()) {
            line.append(" ").append(entity.getKey().entries());
            new java.util.TreeMap<>(entity.getValue()).forEach(
                (key, value) -> line.append(" ").append(key).append(" ").append(value));
        }
        System.out.println(line.toString().replace("{", "").replace("}", ""));
    }

    /** Create, list, describe (DescribeTopicPartitions) and delete a topic. */
    private static void admin(String bootstrap, String topic, int partitions) throws Exception {
        try (Admin admin = Admin.create(common(bootstrap))) {
            admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1))).all().get();
            System.out.println("created " + topic);
            System.out.println("listed " + admin.listTopics().names().get().contains(topic));
            TopicDescription described =
                admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic);
            System.out.println("topic-id " + described.topicId());
            for (TopicPartitionInfo info : described.partitions()) {
                System.out.println("partition " + info.partition() + " leader "
                    + info.leader().id() + " replicas " + info.replicas().size() + " isr "
                    + info.isr().size() + " elr " + info.elr().size() + " last-known-elr "
                    + info.lastKnownElr().size());
            }
            try {
                admin.describeTopics(List.of(topic + "-missing")).allTopicNames().get();
                System.out.println("missing described");
            } catch (ExecutionException error) {
                System.out.println("missing " + error.getCause().getClass().getSimpleName());
            }
            TopicDescription byId = admin.describeTopics(
                TopicCollection.ofTopicIds(List.of(described.topicId())))
                .allTopicIds().get().get(described.topicId());
            System.out.println("by-id " + byId.name() + " " + byId.partitions().size());
            try {
                admin.describeTopics(TopicCollection.ofTopicIds(List.of(Uuid.randomUuid())))
                    .allTopicIds().get();
                System.out.println("missing-id described");
            } catch (ExecutionException error) {
                System.out.println("missing-id "
                    + error.getCause().getClass().getSimpleName());
            }
            admin.deleteTopics(List.of(topic)).all().get();
            System.out.println("deleted " + topic);
            System.out.println("listed " + admin.listTopics().names().get().contains(topic));
        }
    }

    private static Properties producerProps(String bootstrap) {
        Properties props = common(bootstrap);
        props.put("key.serializer", StringSerializer.class.getName());
        props.put("value.serializer", StringSerializer.class.getName());
        props.put("acks", "all");
        props.put("enable.idempotence", "true");
        return props;
    }

    /** Produce COUNT keyed records with the idempotent producer; print where each went. */
    private static void produce(String bootstrap, String topic, int count) throws Exception {
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(producerProps(bootstrap))) {
            List<java.util.concurrent.Future<RecordMetadata>> sent = new ArrayList<>();
            for (int i = 0; i < count; i++) {
                sent.add(producer.send(new ProducerRecord<>(topic, "key-" + i, "value-" + i)));
            }
            for (int i = 0; i < count; i++) {
                RecordMetadata meta = sent.get(i).get();
                System.out.println("sent value-" + i + " " + meta.partition() + " " + meta.offset());
            }
        }
    }

    private static KafkaConsumer<String, String> consumer(String bootstrap, String group,
                                                          String isolation) {
        Properties props = common(bootstrap);
        props.put("group.id", group);
        props.put("key.deserializer", StringDeserializer.class.getName());
        props.put("value.deserializer", StringDeserializer.class.getName());
        props.put("auto.offset.reset", "earliest");
        props.put("enable.auto.commit", "false");
        props.put("isolation.level", isolation);
        return new KafkaConsumer<>(props);
    }

    /** Poll until COUNT records came (or the deadline passed), printing each. */
    private static int pollAll(KafkaConsumer<String, String> consumer, int count) {
        int got = 0;
        long end = System.currentTimeMillis() + DEADLINE_MS;
        while (got < count && System.currentTimeMillis() < end) {
            ConsumerRecords<String, String> records = consumer.poll(POLL);
            for (ConsumerRecord<String, String> record : records) {
                System.out.println("consumed " + record.value() + " " + record.partition() + " "
                    + record.offset());
                got++;
            }
        }
        return got;
    }

    /** Subscribe in a group, read COUNT records, commit them and read the commit back. */
    private static void group(String bootstrap, String topic, String group, int count) {
        try (KafkaConsumer<String, String> consumer =
                 consumer(bootstrap, group, "read_uncommitted")) {
            consumer.subscribe(List.of(topic));
            pollAll(consumer, count);
            System.out.println("assigned " + consumer.assignment().size());
            consumer.commitSync();
            Map<TopicPartition, OffsetAndMetadata> committed =
                consumer.committed(consumer.assignment());
            for (Map.Entry<TopicPartition, OffsetAndMetadata> entry : committed.entrySet()) {
                System.out.println("committed " + entry.getKey().partition() + " "
                    + (entry.getValue() == null ? -1 : entry.getValue().offset()));
            }
        }
    }

    /** One committed transaction that also commits GROUP's offset, one aborted; then read
     * the topic with read_committed. */
    private static void transactions(String bootstrap, String topic, String transactionalId,
                                     String group) throws Exception {
        Properties props = producerProps(bootstrap);
        props.put("transactional.id", transactionalId);
        TopicPartition first = new TopicPartition(topic, 0);
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(props)) {
            producer.initTransactions();
            producer.beginTransaction();
            for (int i = 0; i < 3; i++) {
                producer.send(new ProducerRecord<>(topic, 0, "k", "committed-" + i));
            }
            producer.sendOffsetsToTransaction(
                Collections.singletonMap(first, new OffsetAndMetadata(7)),
                new org.apache.kafka.clients.consumer.ConsumerGroupMetadata(group));
            producer.commitTransaction();
            System.out.println("committed transaction");
            producer.beginTransaction();
            for (int i = 0; i < 2; i++) {
                producer.send(new ProducerRecord<>(topic, 0, "k", "aborted-" + i)).get();
            }
            producer.abortTransaction();
            System.out.println("aborted transaction");
            producer.beginTransaction();
            producer.send(new ProducerRecord<>(topic, 0, "k", "committed-3"));
            producer.commitTransaction();
        }
        try (KafkaConsumer<String, String> reader =
                 consumer(bootstrap, group + "-reader", "read_committed")) {
            reader.assign(List.of(first));
            reader.seekToBeginning(List.of(first));
            pollAll(reader, 4);
            long end = reader.endOffsets(List.of(first)).get(first);
            long deadline = System.currentTimeMillis() + DEADLINE_MS;
            while (reader.position(first) < end && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<String, String> record : reader.poll(POLL)) {
                    System.out.println("consumed " + record.value() + " "
                        + record.partition() + " " + record.offset());
                }
            }
            System.out.println("end " + end + " position " + reader.position(first));
        }
        try (KafkaConsumer<String, String> member = consumer(bootstrap, group, "read_committed")) {
            OffsetAndMetadata offset = member.committed(Set.of(first)).get(first);
            System.out.println("group-offset " + (offset == null ? -1 : offset.offset()));
        }
    }

    /** The kafka-transactions.sh abort flow (KIP-664): a transaction left open in TOPIC's
     * partition 0 holds read_committed readers back; describeProducers finds it and
     * abortTransaction (WriteTxnMarkers) ends it; then read the partition with
     * read_committed. */
    private static void abort(String bootstrap, String topic, String transactionalId)
            throws Exception {
        Properties props = producerProps(bootstrap);
        props.put("transactional.id", transactionalId);
        props.put("transaction.timeout.ms", "600000");
        TopicPartition first = new TopicPartition(topic, 0);
        KafkaProducer<String, String> producer = new KafkaProducer<>(props);
        try (Admin admin = Admin.create(common(bootstrap))) {
            producer.initTransactions();
            producer.beginTransaction();
            for (int i = 0; i < 2; i++) {
                producer.send(new ProducerRecord<>(topic, 0, "k", "hanging-" + i)).get();
            }
            ProducerState open = admin.describeProducers(List.of(first)).partitionResult(first)
                .get().activeProducers().get(0);
            System.out.println("open " + open.producerId() + " "
                + open.currentTransactionStartOffset().orElse(-1));
            admin.abortTransaction(new AbortTransactionSpec(first, open.producerId(),
                (short) open.producerEpoch(), open.coordinatorEpoch().orElse(0))).all().get();
            System.out.println("aborted " + first);
            List<ProducerState> after = admin.describeProducers(List.of(first))
                .partitionResult(first).get().activeProducers();
            System.out.println("still-open " + after.stream()
                .filter(s -> s.currentTransactionStartOffset().isPresent()).count());
        } finally {
            producer.close(Duration.ZERO);
        }
        try (KafkaConsumer<String, String> reader =
                 consumer(bootstrap, transactionalId + "-reader", "read_committed")) {
            reader.assign(List.of(first));
            System.out.println("end " + reader.endOffsets(List.of(first)).get(first));
        }
    }

    /** Produce COUNT records over PARTITIONS and read them back from offset 0; print
     * "ready" and wait for a line on stdin (the test moves partitions meanwhile); then
     * produce and read COUNT more with the same producer and consumer, printing every
     * record read. */
    private static void failover(String bootstrap, String topic, int partitions, int count)
            throws Exception {
        List<TopicPartition> all = new ArrayList<>();
        for (int p = 0; p < partitions; p++) {
            all.add(new TopicPartition(topic, p));
        }
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(producerProps(bootstrap));
             KafkaConsumer<String, String> consumer =
                 consumer(bootstrap, "unused", "read_uncommitted")) {
            consumer.assign(all);
            consumer.seekToBeginning(all);
            sendAll(producer, topic, partitions, "before-", count);
            int got = pollAll(consumer, count);
            System.out.println("ready " + got);
            System.out.flush();
            new java.io.BufferedReader(new java.io.InputStreamReader(System.in)).readLine();
            sendAll(producer, topic, partitions, "after-", count);
            System.out.println("read " + pollAll(consumer, count));
        }
    }

    private static void sendAll(KafkaProducer<String, String> producer, String topic,
                                int partitions, String prefix, int count) throws Exception {
        List<java.util.concurrent.Future<RecordMetadata>> sent = new ArrayList<>();
        for (int i = 0; i < count; i++) {
            sent.add(producer.send(new ProducerRecord<>(topic, i % partitions, "k", prefix + i)));
        }
        for (java.util.concurrent.Future<RecordMetadata> future : sent) {
            future.get();
        }
    }

    /**
     * The replica tools' view of an existing topic on every broker of the cluster: each
     * partition's "leader P B"; each broker's describeLogDirs, "logdir B P" for each partition
     * of the topic it lists; describeReplicaLogDirs, "replica-dir P B yes|no" (whether broker
     * B names a log dir for its replica of P); alterPartitionReassignments of each partition
     * to each broker alone, "reassign P B ok" or "reassign P B refused EXCEPTION"; and
     * "reassignments N" listed in progress afterwards.
     */
    private static void replicas(String bootstrap, String topic) throws Exception {
        try (Admin admin = Admin.create(common(bootstrap))) {
            List<Integer> brokers = new ArrayList<>();
            admin.describeCluster().nodes().get().forEach(node -> brokers.add(node.id()));
            Collections.sort(brokers);
            List<TopicPartitionInfo> partitions =
                admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic).partitions();
            for (TopicPartitionInfo info : partitions) {
                System.out.println("leader " + info.partition() + " " + info.leader().id());
            }
            admin.describeLogDirs(brokers).allDescriptions().get().forEach(
                (broker, dirs) -> dirs.values().forEach(dir -> dir.replicaInfos().keySet().stream()
                    .filter(tp -> tp.topic().equals(topic)).sorted(
                        (x, y) -> Integer.compare(x.partition(), y.partition()))
                    .forEach(tp -> System.out.println("logdir " + broker + " " + tp.partition()))));
            List<TopicPartitionReplica> replicas = new ArrayList<>();
            for (TopicPartitionInfo info : partitions) {
                for (int broker : brokers) {
                    replicas.add(new TopicPartitionReplica(topic, info.partition(), broker));
                }
            }
            admin.describeReplicaLogDirs(replicas).all().get().forEach(
                (replica, info) -> System.out.println("replica-dir " + replica.partition() + " "
                    + replica.brokerId() + " " + (info.getCurrentReplicaLogDir() != null ? "yes" : "no")));
            for (TopicPartitionInfo info : partitions) {
                for (int broker : brokers) {
                    TopicPartition tp = new TopicPartition(topic, info.partition());
                    try {
                        admin.alterPartitionReassignments(Map.of(tp, Optional.of(
                            new NewPartitionReassignment(List.of(broker))))).all().get();
                        System.out.println("reassign " + info.partition() + " " + broker + " ok");
                    } catch (ExecutionException e) {
                        System.out.println("reassign " + info.partition() + " " + broker
                            + " refused " + e.getCause().getClass().getSimpleName());
                    }
                }
            }
            System.out.println("reassignments "
                + admin.listPartitionReassignments().reassignments().get().size());
        }
    }
}
