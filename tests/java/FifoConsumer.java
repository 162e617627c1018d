// A consumer built on the official RocketMQ 5 Java client (rocketmq-client-java, gRPC through the
// proxy), as a RocketMQ 5 user writes one; tests/common/java_client.rs runs it with the JDK's
// single-file source launcher.
//
// Usage: java -cp '<rocketmq-client-java jars>/*' FifoConsumer.java ENDPOINT TOPIC GROUP COUNT SECONDS
//
// Subscribes GROUP to TOPIC (every tag) with a push consumer and prints one tab-separated line per
// delivery, as it is handed to the listener, then acknowledges it:
//   received <unix ms> <event_id> <biz_key> <message group or -> <message id> <delivery time ms or ->
// It prints "started" once subscribed, stops after COUNT deliveries or SECONDS seconds and prints "done <deliveries>". In a FIFO
// consumer group the proxy hands over a message group's next message only once the one before it
// is acknowledged, so the lines of one group are in the order the broker delivered them.
import java.time.Duration;
import java.util.Collections;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.consumer.ConsumeResult;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.FilterExpressionType;
import org.apache.rocketmq.client.apis.consumer.PushConsumer;
import org.apache.rocketmq.client.apis.message.MessageView;

public class FifoConsumer {
    public static void main(String[] args) throws Exception {
        String endpoint = args[0], topic = args[1], group = args[2];
        int count = Integer.parseInt(args[3]);
        long seconds = Long.parseLong(args[4]);
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        ClientConfiguration configuration = ClientConfiguration.newBuilder()
                .setEndpoints(endpoint)
                .enableSsl(false)
                .setRequestTimeout(Duration.ofSeconds(10))
                .build();
        CountDownLatch enough = new CountDownLatch(count);
        AtomicInteger received = new AtomicInteger();
        PushConsumer consumer = provider.newPushConsumerBuilder()
                .setClientConfiguration(configuration)
                .setConsumerGroup(group)
                .setSubscriptionExpressions(
                        Collections.singletonMap(topic, new FilterExpression("*", FilterExpressionType.TAG)))
                .setMessageListener(message -> {
                    print(message);
                    received.incrementAndGet();
                    enough.countDown();
                    return ConsumeResult.SUCCESS;
                })
                .build();
        synchronized (System.out) {
            System.out.println("started");
            System.out.flush();
        }
        enough.await(seconds, TimeUnit.SECONDS);
        synchronized (System.out) {
            System.out.println("done " + received.get());
            System.out.flush();
        }
        consumer.close();
        System.exit(0);
    }

    private static void print(MessageView message) {
        String line = String.join("\t",
                "received",
                Long.toString(System.currentTimeMillis()),
                message.getProperties().getOrDefault("event_id", "-"),
                message.getProperties().getOrDefault("biz_key", "-"),
                message.getMessageGroup().orElse("-"),
                message.getMessageId().toString(),
                message.getDeliveryTimestamp().map(String::valueOf).orElse("-"));
        synchronized (System.out) {
            System.out.println(line);
            System.out.flush();
        }
    }
}
