// One Java producer of the partitions row (python -m bench.partitions): kafka-clients, which
// packs the batches of many partitions into one ProduceRequest (librdkafka sends one
// partition's batch per request). Sends COUNT records of SIZE bytes round-robin over TOPICS
// topics of PER_TOPIC partitions (TOPICS 0: the one topic PREFIX), starting at partition
// FIRST, with acks=all and linger.ms LINGER_MS; the other settings are the client's defaults.
// Prints one JSON line: records acknowledged, errors, the first error, and the epoch seconds
// of the start (after the topics' metadata is known) and of the end.
//
// Usage: PartitionsProducer BOOTSTRAP PREFIX TOPICS PER_TOPIC COUNT FIRST SIZE LINGER_MS

import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.Random;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public final class PartitionsProducer {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String prefix = args[1];
        int topics = Integer.parseInt(args[2]);
        int perTopic = Math.max(Integer.parseInt(args[3]), 1);
        long count = Long.parseLong(args[4]);
        long first = Long.parseLong(args[5]);
        int size = Integer.parseInt(args[6]);
        String lingerMs = args[7];

        List<String> names = new ArrayList<>();
        if (topics == 0) {
            names.add(prefix);
        } else {
            for (int i = 0; i < topics; i++) {
                names.add(String.format("%s%04d", prefix, i));
            }
        }
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        props.put("acks", "all");
        props.put("linger.ms", lingerMs);
        props.put("client.id", "bench-partitions-java");
        byte[] value = new byte[size];
        new Random().nextBytes(value);
        AtomicLong ok = new AtomicLong();
        AtomicLong errors = new AtomicLong();
        AtomicReference<String> firstError = new AtomicReference<>(null);
        try (KafkaProducer<byte[], byte[]> producer =
                new KafkaProducer<>(props, new ByteArraySerializer(), new ByteArraySerializer())) {
            for (String name : names) {
                producer.partitionsFor(name); // the metadata before the clock starts
            }
            double started = System.currentTimeMillis() / 1000.0;
            long total = (long) names.size() * perTopic;
            for (long i = 0; i < count; i++) {
                long slot = (first + i) % total;
                producer.send(new ProducerRecord<>(names.get((int) (slot / perTopic)),
                                                   (int) (slot % perTopic), null, value),
                              (metadata, error) -> {
                                  if (error == null) {
                                      ok.incrementAndGet();
                                  } else {
                                      errors.incrementAndGet();
                                      firstError.compareAndSet(null, error.toString());
                                  }
                              });
            }
            producer.flush();
            double ended = System.currentTimeMillis() / 1000.0;
            String error = firstError.get();
            System.out.printf("{\"records\": %d, \"errors\": %d, \"first_error\": %s, "
                              + "\"started\": %.3f, \"ended\": %.3f}%n",
                              ok.get(), count - ok.get(),
                              error == null ? "null" : quoted(error), started, ended);
        }
    }

    private static String quoted(String text) {
        StringBuilder out = new StringBuilder("\"");
        for (char c : text.toCharArray()) {
            if (c == '"' || c == '\\') {
                out.append('\\').append(c);
            } else if (c < 0x20) {
                out.append(String.format("\\u%04x", (int) c));
            } else {
                out.append(c);
            }
        }
        return out.append('"').toString();
    }
}
