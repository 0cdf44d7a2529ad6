// OpenAI's Agents SDK for realtime (@openai/agents-realtime) against our server, with the SDK's defaults: a
// RealtimeAgent with instructions and a tool() (zod parameters) in a RealtimeSession over WebSocket.
// Usage: node agents_realtime_session.mjs WS_URL SPEECH_WAV   (WS_URL: ws://host:port/v1/realtime)
//
// Three phases: "greeting" (a response on the empty conversation), "spoken" (SPEECH_WAV, pcm16 24 kHz mono, sent
// through session.sendAudio in 20 ms chunks at the pace of speech, then silence as a microphone sends it until the
// reply is done; the server's turn detection ends the turn and
// starts the reply), "tool" (a text message whose reply calls the tool; the SDK runs it, sends its output and asks
// for the spoken answer). Before each phase, and once more before closing ("inspect"), it prints
// {"ready": PHASE} on stdout and waits for one line on stdin, so that the driver can prepare the model.
// At the end it prints {"summary": {...}}: every server event (as received), each response's transcript, audio bytes
// and output item types, the user's input transcripts, the tool calls, the session's last session.updated, the
// session's history and every `error` the session emitted. Exits 0 after the summary, 1 on a failure (stderr says
// which), 2 when a phase takes more than 60 s.
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { RealtimeAgent, RealtimeSession, tool } from "@openai/agents-realtime";
import { z } from "zod";

const [url, wavPath] = process.argv.slice(2);
const PHASE_TIMEOUT_MS = 60_000;
const CHUNK_BYTES = 960; // 20 ms of pcm16 at 24 kHz
const CHUNK_MS = 20;

const toolCalls = [];
const getWeather = tool({
  name: "get_weather",
  description: "The weather in a city, now.",
  parameters: z.object({ city: z.string() }),
  execute: async ({ city }) => {
    toolCalls.push({ city });
    return `Sunny and 21 degrees in ${city}.`;
  },
});
const agent = new RealtimeAgent({
  name: "Weather assistant",
  instructions: "You are a weather assistant. Greet the caller, then answer questions about the weather.",
  tools: [getWeather],
});
const session = new RealtimeSession(agent, { transport: "websocket" });

const events = []; // every server event, as the transport parsed it
const errors = []; // every `error` the session emitted (server error events, socket and tool failures)
const toolEnds = [];
session.on("transport_event", (event) => events.push(event));
session.on("error", (error) => errors.push(describe(error)));
session.on("agent_tool_end", (_context, _agent, calledTool, result) => toolEnds.push({ name: calledTool.name, result }));

function describe(error) {
  const inner = error?.error ?? error;
  if (inner instanceof Error) return { message: inner.message };
  try {
    return JSON.parse(JSON.stringify(inner));
  } catch {
    return { message: String(inner) };
  }
}

function fail(message) {
  console.error(message);
  process.exit(1);
}

const stdin = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
async function ready(phase) {
  console.log(JSON.stringify({ ready: phase }));
  const line = await stdin.next();
  if (line.done) fail(`stdin closed before phase ${phase}`);
}

/** Resolves with the first event (from `from` on) that `match` accepts; fails after PHASE_TIMEOUT_MS. */
function until(what, match, from = 0) {
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      console.error(`no ${what} within ${PHASE_TIMEOUT_MS / 1000} s; events: ${events.map((e) => e.type).join(" ")}`);
      process.exit(2);
    }, PHASE_TIMEOUT_MS);
    const check = () => {
      const found = events.slice(from).find(match);
      if (found === undefined) return false;
      clearTimeout(timer);
      session.off("transport_event", check);
      resolve(found);
      return true;
    };
    if (!check()) session.on("transport_event", check);
  });
}

function responsesDone(from) {
  return events.slice(from).filter((e) => e.type === "response.done").length;
}

/** Each response.done's id, status, output item types, its audio transcript and the audio bytes it carried. */
function responses() {
  return events
    .filter((e) => e.type === "response.done")
    .map(({ response }) => {
      const mine = events.filter((e) => e.response_id === response.id);
      const transcript = mine
        .filter((e) => e.type === "response.output_audio_transcript.delta")
        .map((e) => e.delta)
        .join("");
      const audioBytes = mine
        .filter((e) => e.type === "response.output_audio.delta")
        .reduce((total, e) => total + Buffer.from(e.delta, "base64").length, 0);
      const output = (response.output ?? []).map((item) => item.type);
      return { id: response.id, status: response.status, output, transcript, audioBytes };
    });
}

/** The pcm16 samples of a RIFF/WAVE file's data chunk. */
function wavData(path) {
  const file = readFileSync(path);
  let at = 12;
  while (at + 8 <= file.length) {
    const id = file.toString("ascii", at, at + 4);
    const size = file.readUInt32LE(at + 4);
    if (id === "data") return file.subarray(at + 8, at + 8 + size);
    at += 8 + size + (size % 2);
  }
  fail(`${path} has no data chunk`);
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

await session.connect({ apiKey: "x", url });

// 1. a greeting: a response on the empty conversation
await ready("greeting");
let mark = events.length;
session.transport.sendEvent({ type: "response.create" });
await until("greeting response.done", (e) => e.type === "response.done", mark);
const greeting = responses().at(-1);
await sleep((greeting.audioBytes / 48_000) * 1000); // the caller hears it out before speaking

// 2. a spoken turn, ended by the server's turn detection
await ready("spoken");
mark = events.length;
const speech = wavData(wavPath);
for (let at = 0; at < speech.length; at += CHUNK_BYTES) {
  const chunk = speech.subarray(at, at + CHUNK_BYTES);
  session.sendAudio(chunk.buffer.slice(chunk.byteOffset, chunk.byteOffset + chunk.length));
  await sleep(CHUNK_MS);
}
// then the quiet room, as a microphone keeps sending it: the turn detector's clock is the audio it hears, and a
// semantic detector that judged the sentence unfinished waits for more of it before it ends the turn
const quiet = new Uint8Array(CHUNK_BYTES);
let listening = true;
const room = (async () => {
  while (listening) {
    session.sendAudio(quiet.buffer.slice(0));
    await sleep(CHUNK_MS);
  }
})();
await until("the spoken turn's response.done", (e) => e.type === "response.done", mark);
listening = false;
await room;
await until("the input transcript", (e) => e.type === "conversation.item.input_audio_transcription.completed", mark);
await sleep((responses().at(-1).audioBytes / 48_000) * 1000);

// 3. a tool round trip: the reply calls get_weather, the SDK runs it and asks for the spoken answer
await ready("tool");
mark = events.length;
session.sendMessage("What is the weather in Paris?");
await until("the tool's answer", (e) => e.type === "response.done" && responsesDone(mark) >= 2, mark);
await sleep(300); // anything the server still sends (an error after the last response) is seen

await ready("inspect");
const updated = events.filter((e) => e.type === "session.updated").at(-1);
const summary = {
  events,
  errors,
  responses: responses(),
  inputTranscripts: events
    .filter((e) => e.type === "conversation.item.input_audio_transcription.completed")
    .map((e) => e.transcript),
  toolCalls,
  toolEnds,
  session: updated?.session ?? null,
  history: session.history.map((item) => ({
    type: item.type,
    role: item.role ?? null,
    content: (item.content ?? []).map((part) => [part.type, part.transcript ?? part.text ?? null]),
    output: item.output ?? null,
  })),
};
session.close();
process.stdout.write(`${JSON.stringify({ summary })}\n`, () => process.exit(0)); // exit once it is all written
