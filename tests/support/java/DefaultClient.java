// Java's built-in HTTP client with its defaults: HTTP/2 preferred, so on http:// every request
// on a new connection offers an upgrade to h2c (Connection: Upgrade, HTTP2-Settings). Sends the
// JSON body in args[1] to args[0] args[2] times, one client, and prints for each answer its
// status, protocol version, milliseconds and body length, then the last body. With a fourth
// argument "1.1", the client is built for HTTP/1.1 (no offer): the baseline.
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;

public class DefaultClient {
    public static void main(String[] args) throws Exception {
        HttpClient client = args.length > 3 && args[3].equals("1.1")
            ? HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).build()
            : HttpClient.newHttpClient();
        String last = "";
        for (int i = 0; i < Integer.parseInt(args[2]); i++) {
            HttpRequest request = HttpRequest.newBuilder(URI.create(args[0]))
                .header("Content-Type", "application/json")
                .timeout(Duration.ofSeconds(60))
                .POST(HttpRequest.BodyPublishers.ofString(args[1]))
                .build();
            long start = System.nanoTime();
            HttpResponse<String> response = client.send(request, HttpResponse.BodyHandlers.ofString());
            long millis = (System.nanoTime() - start) / 1_000_000;
            last = response.body();
            System.out.println(response.statusCode() + " " + response.version() + " " + millis + " " + last.length());
        }
        System.out.print(last);
    }
}
