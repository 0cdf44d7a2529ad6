// One text turn through the `openai` npm package's realtime client (OpenAIRealtimeWS, the `ws` library) over
// wss://: session.update, conversation.item.create, response.create, up to response.done.
// Usage: node openai_wss_text_turn.mjs BASE_URL API_KEY   (BASE_URL: https://host:port/v1)
// Prints every server event as one JSON line; exits 0 once response.done arrives with no error event before it,
// 1 on an error event, a socket error or a close before response.done, 2 after 60 s without response.done.
import OpenAI from "openai";
import { OpenAIRealtimeWS } from "openai/realtime/ws";

const [baseURL, apiKey] = process.argv.slice(2);
const client = new OpenAI({ apiKey, baseURL });
const rt = new OpenAIRealtimeWS({ model: "gpt-realtime" }, client);
const timer = setTimeout(() => {
  console.error("no response.done within 60 s");
  process.exit(2);
}, 60_000);

function fail(message) {
  console.error(message);
  process.exit(1);
}

rt.on("event", (event) => console.log(JSON.stringify(event)));
rt.on("error", (err) => fail(`error: ${err.message ?? JSON.stringify(err)}`));
rt.socket.on("close", (code) => fail(`the socket closed (code ${code}) before response.done`));
rt.on("session.created", () => {
  rt.send({
    type: "session.update",
    session: { type: "realtime", output_modalities: ["text"], instructions: "Answer in one word.", max_output_tokens: 8 },
  });
});
rt.on("session.updated", () => {
  rt.send({
    type: "conversation.item.create",
    item: { type: "message", role: "user", content: [{ type: "input_text", text: "Hello over TLS?" }] },
  });
  rt.send({ type: "response.create" });
});
rt.on("response.done", (event) => {
  clearTimeout(timer);
  rt.socket.removeAllListeners("close");
  rt.close();
  console.error(`response.done: ${event.response.status}`);
  process.exit(0);
});
