// The voice chat page: settings, connect/disconnect, live transcript, input level, and the
// per-turn latency (end of speech → first audio). Transports live in rtc.js (WebRTC, default)
// and ws.js (WebSocket fallback); both hand every server event to `handleEvent`.
//
// `window.omniDemo` exposes the page's state (connection, transcript, audio statistics) for
// tests and for anyone poking at the console.

import { Camera } from "./camera.js";
import { connectWebRTC } from "./rtc.js";
import { connectWebSocket } from "./ws.js";

const AUDIBLE_RMS = 0.01; // below this, output audio counts as silence
const MONITOR_MS = 10; // how often the analysers are read
const MAX_LOG = 300;

const $ = (id) => document.getElementById(id);
const ui = {
  banner: $("banner"),
  status: $("status"),
  transport: $("transport"),
  apiKey: $("api-key"),
  connect: $("connect"),
  voice: $("voice"),
  maxTokens: $("max-tokens"),
  instructions: $("instructions"),
  apply: $("apply"),
  micLevel: $("mic-level"),
  latency: $("latency"),
  latencySummary: $("latency-summary"),
  transcript: $("transcript"),
  emptyHint: $("empty-hint"),
  log: $("log"),
  audio: $("remote-audio"),
  cameraToggle: $("camera-toggle"),
  cameraPreview: $("camera-preview"),
};

const demo = {
  state: "idle", // idle | connecting | connected | closed | error
  transport: null,
  error: null,
  events: [], // server event types, in order
  transcript: [], // {itemId, role, text, status}
  stats: { micMaxRms: 0, outputMaxRms: 0, outputAudibleMs: 0, audioDeltas: 0, latenciesMs: [] },
  camera: { on: false, picturesSent: 0, lastPicture: null }, // lastPicture: {width, height, bytes} (WebSocket)
};
window.omniDemo = demo;

let call = null; // {session, ctx, micStream, timers}

// --- status, log, banner ---------------------------------------------------------------------

function setState(state, text) {
  demo.state = state;
  ui.status.dataset.state = state;
  ui.status.textContent = text || state;
  const busy = state === "connecting" || state === "connected";
  ui.connect.textContent = busy ? "Disconnect" : "Connect";
  ui.transport.disabled = busy;
  ui.apply.disabled = state !== "connected";
}

function log(text, cls) {
  const li = document.createElement("li");
  li.textContent = `${new Date().toLocaleTimeString()} ${text}`;
  if (cls) li.className = cls;
  ui.log.append(li);
  while (ui.log.children.length > MAX_LOG) ui.log.firstChild.remove();
}

async function showServerReport() {
  try {
    const health = await (await fetch("/healthz")).json();
    if (health.random_weights) {
      ui.banner.textContent =
        "This server runs a model with random weights: it is a test setup, and what it says is noise, not answers.";
      ui.banner.hidden = false;
    }
    if (health.webrtc === false) {
      // installed without the webrtc extra (or started with --no-webrtc): its calls endpoint answers 501
      const option = ui.transport.querySelector('option[value="webrtc"]');
      option.disabled = true;
      option.textContent = "WebRTC (not on this server)";
      ui.transport.value = "websocket";
    }
  } catch (error) {
    log(`/healthz unavailable: ${error}`);
  }
}

// --- transcript ------------------------------------------------------------------------------

const turns = new Map(); // item id → {entry, li}

function turn(itemId, role) {
  let t = turns.get(itemId);
  if (!t) {
    const entry = { itemId, role, text: "", status: "in_progress" };
    const li = document.createElement("li");
    li.className = `turn ${role} placeholder`;
    li.innerHTML = `<span class="who">${role === "user" ? "You" : "Assistant"}</span><span class="text"></span>`;
    ui.transcript.append(li);
    ui.emptyHint.hidden = true;
    t = { entry, li };
    turns.set(itemId, t);
    demo.transcript.push(entry);
  }
  return t;
}

function setText(t, text, placeholder = false) {
  t.entry.text = text;
  t.li.querySelector(".text").textContent = text;
  t.li.classList.toggle("placeholder", placeholder);
  t.li.scrollIntoView({ block: "end" });
}

// --- latency ---------------------------------------------------------------------------------

const latency = {
  pendingSince: null, // performance.now() at the last speech_stopped still waiting for audio

  endOfSpeech() {
    this.pendingSince = performance.now();
  },

  firstAudio() {
    if (this.pendingSince === null) return;
    const ms = Math.round(performance.now() - this.pendingSince);
    this.pendingSince = null;
    demo.stats.latenciesMs.push(ms);
    const sorted = [...demo.stats.latenciesMs].sort((a, b) => a - b);
    ui.latency.textContent = `${ms} ms`;
    ui.latencySummary.textContent = `median ${sorted[sorted.length >> 1]} ms over ${sorted.length} turn(s)`;
  },
};

// --- audio monitors --------------------------------------------------------------------------

function rmsOf(analyser, buffer) {
  analyser.getFloatTimeDomainData(buffer);
  let sum = 0;
  for (const x of buffer) sum += x * x;
  return Math.sqrt(sum / buffer.length);
}

// Reads the microphone level and the played output: on WebRTC the first audible output after
// the end of speech is the latency's end (audio deltas do not exist there).
function startMonitors(micAnalyser, outputAnalyser, kind) {
  const micBuffer = new Float32Array(micAnalyser.fftSize);
  const outBuffer = new Float32Array(outputAnalyser.fftSize);
  return setInterval(() => {
    const mic = rmsOf(micAnalyser, micBuffer);
    demo.stats.micMaxRms = Math.max(demo.stats.micMaxRms, mic);
    ui.micLevel.value = Math.min(1, Math.sqrt(mic) * 2); // perceptual-ish scale
    const out = rmsOf(outputAnalyser, outBuffer);
    demo.stats.outputMaxRms = Math.max(demo.stats.outputMaxRms, out);
    if (out > AUDIBLE_RMS) {
      demo.stats.outputAudibleMs += MONITOR_MS;
      if (kind === "webrtc") latency.firstAudio();
    }
  }, MONITOR_MS);
}

function audible(base64) {
  // A delta carrying any sample above the threshold (pcm16 little-endian).
  const binary = atob(base64);
  const limit = AUDIBLE_RMS * 32768;
  for (let i = 0; i + 1 < binary.length; i += 2) {
    const v = (binary.charCodeAt(i) | (binary.charCodeAt(i + 1) << 8)) << 16 >> 16;
    if (Math.abs(v) > limit) return true;
  }
  return false;
}

// --- server events ---------------------------------------------------------------------------

function handleEvent(event) {
  demo.events.push(event.type);
  if (!event.type.endsWith(".delta")) log(event.type, event.type === "error" ? "error" : "");
  switch (event.type) {
    case "session.created":
      setState("connected", `connected (${demo.transport})`);
      if (call) call.created = true;
      sendSettings();
      break;
    case "input_audio_buffer.speech_started": {
      const t = turn(event.item_id, "user");
      t.startMs = event.audio_start_ms;
      setText(t, "[speaking…]", true);
      break;
    }
    case "input_audio_buffer.speech_stopped": {
      latency.endOfSpeech();
      const t = turn(event.item_id, "user");
      const seconds = ((event.audio_end_ms - (t.startMs ?? event.audio_end_ms)) / 1000).toFixed(1);
      if (t.entry.status === "in_progress") setText(t, `[speech, ${seconds} s]`, true);
      break;
    }
    case "conversation.item.input_audio_transcription.completed": {
      const t = turn(event.item_id, "user");
      t.entry.status = "completed";
      setText(t, event.transcript);
      break;
    }
    case "response.output_audio_transcript.delta":
    case "response.output_text.delta": {
      const t = turn(event.item_id, "assistant");
      setText(t, t.entry.text + event.delta);
      break;
    }
    case "response.output_audio.delta":
      demo.stats.audioDeltas += 1;
      if (audible(event.delta)) latency.firstAudio();
      break;
    case "response.done":
      for (const item of event.response.output || []) {
        const t = turns.get(item.id);
        if (!t) continue;
        t.entry.status = event.response.status;
        t.li.classList.toggle("interrupted", event.response.status === "cancelled");
      }
      break;
    case "error":
      log(`error ${event.error.code}: ${event.error.message}`, "error");
      break;
  }
}

// --- settings --------------------------------------------------------------------------------

// semantic_vad: the server's turn model (Smart Turn v3.2) ends a finished sentence ~200 ms after the last word and
// waits through a mid-sentence pause; "auto" is OpenAI's medium eagerness.
const TURN_DETECTION = { type: "semantic_vad", eagerness: "auto" };

function settingsUpdate() {
  const session = { type: "realtime", audio: { input: { turn_detection: TURN_DETECTION } } };
  const instructions = ui.instructions.value.trim();
  if (instructions) session.instructions = instructions;
  const maxTokens = parseInt(ui.maxTokens.value, 10);
  if (maxTokens > 0) session.max_output_tokens = maxTokens;
  const voice = ui.voice.value.trim();
  if (voice) session.audio.output = { voice };
  return { type: "session.update", session };
}

// Sent when the session starts (session.created may arrive before the transport is handed
// over: then right after) and by the Apply button.
function sendSettings() {
  const update = settingsUpdate();
  if (update && call && call.session) call.session.send(update);
}

// --- camera --------------------------------------------------------------------------------

const camera = new Camera(ui.cameraPreview);

camera.onChange = (track) => {
  demo.camera.on = track !== null;
  ui.cameraToggle.textContent = track ? "Turn the camera off" : "Turn the camera on";
  ui.cameraToggle.setAttribute("aria-pressed", String(track !== null));
  if (call && call.session) call.session.setVideoTrack(track);
};

function pictureSent(dataUri) {
  demo.camera.picturesSent += 1;
  const image = new Image();
  image.onload = () => {
    demo.camera.lastPicture = { width: image.width, height: image.height, bytes: Math.floor((dataUri.length * 3) / 4) };
  };
  image.src = dataUri;
  log("picture sent (input_image)");
}

async function toggleCamera() {
  ui.cameraToggle.disabled = true;
  try {
    if (camera.stream) camera.stop();
    else await camera.start();
  } catch (error) {
    log(`camera unavailable: ${error}`, "error");
  } finally {
    ui.cameraToggle.disabled = false;
  }
}

// --- connect / disconnect --------------------------------------------------------------------

async function connect() {
  demo.transport = ui.transport.value;
  demo.error = null;
  setState("connecting", `connecting (${demo.transport})…`);
  const ctx = new AudioContext(); // the device's rate: the worklets resample (Firefox needs it)
  const attempt = { ctx, micStream: null, session: null, timer: null, created: false };
  call = attempt;
  const current = () => call === attempt; // false once the user pressed Disconnect meanwhile
  try {
    await ctx.resume();
    attempt.micStream = await navigator.mediaDevices.getUserMedia({
      audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true, channelCount: 1 },
    });
    if (!current()) return stopTracks(attempt.micStream);
    const micAnalyser = ctx.createAnalyser();
    ctx.createMediaStreamSource(attempt.micStream).connect(micAnalyser);
    const options = {
      micStream: attempt.micStream,
      videoTrack: camera.track,
      camera,
      onPicture: pictureSent,
      ctx,
      audioElement: ui.audio,
      apiKey: ui.apiKey.value.trim(),
      onEvent: (event) => current() && handleEvent(event),
      onClose: (reason) => current() && disconnect(reason),
    };
    const session = demo.transport === "webrtc" ? await connectWebRTC(options) : await connectWebSocket(options);
    if (!current()) return session.close();
    attempt.session = session;
    attempt.timer = startMonitors(micAnalyser, session.outputAnalyser, session.kind);
    if (attempt.created) sendSettings();
  } catch (error) {
    if (!current()) return;
    demo.error = String(error);
    log(`connect failed: ${error}`, "error");
    teardown();
    setState("error", "connection failed");
  }
}

function stopTracks(stream) {
  stream.getTracks().forEach((track) => track.stop());
}

function teardown() {
  if (!call) return;
  const { session, micStream, ctx, timer } = call;
  call = null;
  clearInterval(timer);
  if (session) session.close();
  if (micStream) stopTracks(micStream);
  ctx.close();
  latency.pendingSince = null;
  ui.micLevel.value = 0;
}

function disconnect(reason) {
  teardown();
  if (reason) log(reason);
  setState("closed", reason ? `disconnected: ${reason}` : "disconnected");
}

ui.connect.addEventListener("click", () => {
  if (demo.state === "connecting" || demo.state === "connected") disconnect();
  else connect();
});
ui.apply.addEventListener("click", sendSettings);
ui.cameraToggle.addEventListener("click", toggleCamera);
setState("idle", "not connected");
showServerReport();
