// An unmodified @octokit/webhooks app, as a Probot or octokit user runs
// one: createNodeMiddleware verifies X-Hub-Signature-256 with the app's own
// secret and calls the webhooks.on(...) handlers. It stands downstream of
// hookinbox in the tests (tests/tests/it/octokit_front.rs).
//
// Settings (environment):
//   OCTOKIT_APP_SECRET  the app's webhook secret
//   PORT                listens on 127.0.0.1:PORT
//   RECORD_FILE         appends one line per event: "handled <delivery id>
//                       <event>" from a handler, "signature-failure <id>"
//                       or "error <id>" from webhooks.onError; a file, so
//                       that the record outlives a stop and a start. Before
//                       the middleware sees a POST, "received <X-GitHub-
//                       Delivery> <Idempotency-Key>" (each "-" when absent),
//                       so that a test can tell what each request carried.
//
// GET /ready answers 200 once listening.

import { appendFileSync } from "node:fs";
import { createServer } from "node:http";
import { Webhooks, createNodeMiddleware } from "@octokit/webhooks";

const secret = process.env.OCTOKIT_APP_SECRET;
const port = Number(process.env.PORT);
const recordFile = process.env.RECORD_FILE;
if (!secret || !port || !recordFile) {
  console.error("set OCTOKIT_APP_SECRET, PORT and RECORD_FILE");
  process.exit(2);
}

const record = (line) => appendFileSync(recordFile, `${line}\n`);

const webhooks = new Webhooks({ secret });

// The events the tests send; each handler records the delivery it ran for.
for (const event of ["push", "pull_request", "issues", "issue_comment", "release"]) {
  webhooks.on(event, ({ id, name }) => {
    record(`handled ${id} ${name}`);
  });
}

webhooks.onError((error) => {
  const id = error.event?.id ?? "-";
  if (/signature does not match/.test(error.message)) {
    record(`signature-failure ${id}`);
  } else {
    record(`error ${id}`);
  }
});

const middleware = createNodeMiddleware(webhooks, {
  log: { debug() {}, info() {}, warn() {}, error() {} },
});

createServer((request, response) => {
  if (request.method === "GET" && request.url === "/ready") {
    response.writeHead(200, { "content-type": "text/plain" }).end("ready\n");
    return;
  }
  if (request.method === "POST") {
    const header = (name) => request.headers[name] || "-";
    record(`received ${header("x-github-delivery")} ${header("idempotency-key")}`);
  }
  middleware(request, response, () => {
    response.writeHead(404).end();
  });
}).listen(port, "127.0.0.1");
