// WebSocket transport: `/v1/realtime`, audio as base64 PCM16 24 kHz events, captured and played
// by the AudioWorklets of worklets.js.
//
// Barge-in: the server cancels the reply when its VAD hears the user; this side stops local
// playback at once on `input_audio_buffer.speech_started` (and on a cancelled `response.done`)
// and truncates the interrupted item to what was actually heard, so the model's context matches
// the user's experience. Echo: see the notes in index.html. The camera's pictures go up as
// `input_image` items (camera.js, PictureSender).

import { PictureSender } from "./camera.js";

const WIRE_RATE = 24000;
const CHUNK_MS = 20;

export function int16ToBase64(pcm) {
  // PCM16 little-endian: typed arrays use the platform's byte order, little-endian everywhere
  // browsers run.
  const bytes = new Uint8Array(pcm.buffer, pcm.byteOffset, pcm.byteLength);
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(binary);
}

export function base64ToFloat32(data) {
  const binary = atob(data);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  const pcm = new Int16Array(bytes.buffer, 0, bytes.length >> 1);
  const out = new Float32Array(pcm.length);
  for (let i = 0; i < pcm.length; i++) out[i] = pcm[i] / 32768;
  return out;
}

function opened(ws) {
  return new Promise((resolve, reject) => {
    ws.addEventListener("open", resolve, { once: true });
    ws.addEventListener("close", (e) => reject(new Error(`WebSocket refused (code ${e.code}${e.reason ? ": " + e.reason : ""})`)), { once: true });
  });
}

// Connect; `onEvent(event)` gets every server event, `onClose(reason)` once when the socket ends.
// `camera`: the page's Camera (camera.js); `onPicture(dataUri)` reports each picture sent.
// Returns {kind, send(event), setVideoTrack(track), outputAnalyser, close()}.
export async function connectWebSocket({ micStream, camera, ctx, apiKey, onEvent, onClose, onPicture }) {
  const url = new URL("/v1/realtime", location.href);
  url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  const protocols = ["realtime"]; // the server echoes it; the key rides as a second subprotocol
  if (apiKey) protocols.push(`openai-insecure-api-key.${apiKey}`);
  const ws = new WebSocket(url, protocols);
  let player = null; // set once the worklets are up; no reply audio can come before that
  let pictures = null; // likewise
  ws.onmessage = (message) => {
    const event = JSON.parse(message.data);
    if (player) player.handle(event);
    if (pictures) pictures.handle(event);
    onEvent(event);
  };
  await opened(ws);
  ws.onclose = (e) => onClose(`WebSocket closed (code ${e.code}${e.reason ? ": " + e.reason : ""})`);
  const send = (event) => { if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(event)); };
  pictures = new PictureSender(camera, send, onPicture);

  await ctx.audioWorklet.addModule(new URL("./worklets.js", import.meta.url));
  const source = ctx.createMediaStreamSource(micStream);
  const capture = new AudioWorkletNode(ctx, "omni-capture", {
    numberOfOutputs: 1,
    outputChannelCount: [1],
    processorOptions: { targetRate: WIRE_RATE, chunkMs: CHUNK_MS },
  });
  const mute = ctx.createGain(); // keeps the capture node pulled by the graph, silently
  mute.gain.value = 0;
  source.connect(capture).connect(mute).connect(ctx.destination);
  capture.port.onmessage = (e) => send({ type: "input_audio_buffer.append", audio: int16ToBase64(e.data) });

  const playback = new AudioWorkletNode(ctx, "omni-playback", {
    numberOfInputs: 0,
    numberOfOutputs: 1,
    outputChannelCount: [1],
    processorOptions: { inputRate: WIRE_RATE, prebufferMs: 120 },
  });
  const outputAnalyser = ctx.createAnalyser();
  playback.connect(outputAnalyser);
  playback.connect(ctx.destination);

  player = new Player(playback, send);

  return {
    kind: "websocket",
    send,
    setVideoTrack: () => {}, // pictures are taken from the camera when sent
    outputAnalyser,
    close() {
      pictures.stop();
      ws.onclose = null;
      ws.close(1000);
      capture.port.onmessage = null;
      source.disconnect();
      playback.disconnect();
    },
  };
}

// Feeds reply audio to the playback worklet and undoes what the user talked over.
class Player {
  constructor(node, send) {
    this.node = node;
    this.send = send;
    this.receivedMs = new Map(); // item id → ms of audio received
    this.heard = { itemId: null, playedMs: 0 }; // the worklet's latest report
    this.interrupted = null; // item id whose playback was cut, awaiting the worklet's count
    this.lastItemId = null; // the item of the latest audio delta
    this.silenced = new Set(); // items cut off: their deltas still in flight are not played
    node.port.onmessage = (e) => this.onWorklet(e.data);
  }

  handle(event) {
    switch (event.type) {
      case "response.output_audio.delta": {
        this.lastItemId = event.item_id;
        if (this.silenced.has(event.item_id)) break;
        const samples = base64ToFloat32(event.delta);
        this.receivedMs.set(event.item_id, (this.receivedMs.get(event.item_id) || 0) + (1000 * samples.length) / WIRE_RATE);
        this.node.port.postMessage({ type: "audio", itemId: event.item_id, samples }, [samples.buffer]);
        break;
      }
      case "response.output_audio.done":
        this.node.port.postMessage({ type: "end" });
        break;
      case "input_audio_buffer.speech_started":
        this.stop();
        break;
      case "response.done":
        if (event.response.status === "cancelled") this.stop();
        break;
    }
  }

  stop() {
    if (this.lastItemId !== null) this.silenced.add(this.lastItemId);
    if (this.interrupted === null && this.heard.itemId !== null) this.interrupted = this.heard.itemId;
    this.node.port.postMessage({ type: "clear" });
  }

  onWorklet(message) {
    if (message.type === "progress" || message.type === "drained") this.heard = message;
    if (message.type !== "cleared") return;
    const itemId = this.interrupted;
    this.interrupted = null;
    if (itemId === null || message.itemId !== itemId) return;
    const received = this.receivedMs.get(itemId) || 0;
    const heardMs = Math.floor(message.playedMs);
    if (heardMs < received - 1) {
      this.send({ type: "conversation.item.truncate", item_id: itemId, content_index: 0, audio_end_ms: heardMs });
    }
    this.heard = { itemId: null, playedMs: 0 };
  }
}
