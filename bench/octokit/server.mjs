// B_octokit: octokit's own webhook receiver, the peer scripts/bench.sh
// measures ingest against. It verifies X-Hub-Signature-256 and hands each
// event to an in-memory no-op, as a Probot-style app without state would:
// nothing is durable, nothing is deduplicated.
//   OCTOKIT_SECRET=... OCTOKIT_PORT=... node server.mjs
import { createServer } from "node:http";
import { Webhooks, createNodeMiddleware } from "@octokit/webhooks";

const secret = process.env.OCTOKIT_SECRET;
const port = Number(process.env.OCTOKIT_PORT ?? "3000");
if (!secret) {
  console.error("OCTOKIT_SECRET is required");
  process.exit(2);
}
const webhooks = new Webhooks({ secret });
let received = 0;
webhooks.onAny(() => {
  received += 1;
});
const middleware = createNodeMiddleware(webhooks, { path: "/webhooks/github" });
createServer((req, res) => {
  if (req.url === "/healthz") {
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify({ received }));
    return;
  }
  middleware(req, res, () => {
    res.writeHead(404);
    res.end();
  });
}).listen(port, "127.0.0.1");
