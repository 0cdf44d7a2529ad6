// WebRTC transport (OpenAI's GA convention): POST the SDP offer to /v1/realtime/calls, get the
// answer; the microphone is an Opus track, the reply a remote track played by an <audio> element
// (which also lets the browser's echo canceller remove it from the microphone), and events travel
// on the "oai-events" data channel. The server interrupts and clears its own output on barge-in.
// The camera rides on a video sender added at call start (with no track while the camera is off):
// `setVideoTrack` swaps its track, with no renegotiation.

const EVENTS_CHANNEL = "oai-events";
const GATHER_TIMEOUT_MS = 3000;
const OPEN_TIMEOUT_MS = 10000;

// The server cannot trickle ICE: the offer must carry the browser's candidates.
function gatheringComplete(pc) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      if (pc.iceGatheringState !== "complete") return;
      pc.removeEventListener("icegatheringstatechange", done);
      resolve();
    };
    pc.addEventListener("icegatheringstatechange", done);
    setTimeout(resolve, GATHER_TIMEOUT_MS); // offer what was gathered so far
  });
}

function channelOpen(channel) {
  if (channel.readyState === "open") return Promise.resolve();
  return new Promise((resolve, reject) => {
    channel.addEventListener("open", resolve, { once: true });
    setTimeout(() => reject(new Error("the data channel did not open (no WebRTC connection)")), OPEN_TIMEOUT_MS);
  });
}

// Connect; `onEvent(event)` gets every server event, `onClose(reason)` once when the call ends.
// `videoTrack`: the camera's track at call start, or null. Returns {kind, send(event),
// setVideoTrack(track), outputAnalyser, close()}.
export async function connectWebRTC({ micStream, videoTrack = null, ctx, audioElement, apiKey, onEvent, onClose }) {
  const pc = new RTCPeerConnection({ iceServers: [] });
  const remoteStream = new Promise((resolve) => {
    pc.ontrack = (e) => resolve(e.streams[0] || new MediaStream([e.track]));
  });
  for (const track of micStream.getAudioTracks()) pc.addTrack(track, micStream);
  const video = pc.addTransceiver(videoTrack || "video", { direction: "sendonly" });
  const channel = pc.createDataChannel(EVENTS_CHANNEL);
  try {
    await pc.setLocalDescription(await pc.createOffer());
    await gatheringComplete(pc);
    const headers = { "Content-Type": "application/sdp" };
    if (apiKey) headers.Authorization = `Bearer ${apiKey}`;
    const response = await fetch(new URL("/v1/realtime/calls", location.href), {
      method: "POST",
      body: pc.localDescription.sdp,
      headers,
    });
    const body = await response.text();
    if (!response.ok) throw new Error(`POST /v1/realtime/calls: ${response.status} ${body}`);
    await pc.setRemoteDescription({ type: "answer", sdp: body });
  } catch (error) {
    pc.close();
    throw error;
  }

  let closed = false;
  const end = (reason) => {
    if (closed) return;
    closed = true;
    pc.close();
    onClose(reason);
  };
  channel.onmessage = (message) => onEvent(JSON.parse(message.data));
  channel.onclose = () => end("the server closed the call");
  pc.onconnectionstatechange = () => {
    if (pc.connectionState === "failed" || pc.connectionState === "closed") end(`connection ${pc.connectionState}`);
  };

  // The stream must play in an <audio> element: Chrome delivers no samples to Web Audio
  // from a remote WebRTC stream that no media element consumes.
  const stream = await remoteStream;
  audioElement.srcObject = stream;
  audioElement.play().catch((error) => console.warn("autoplay refused:", error));
  const outputAnalyser = ctx.createAnalyser();
  ctx.createMediaStreamSource(stream).connect(outputAnalyser);
  try {
    await channelOpen(channel);
  } catch (error) {
    closed = true;
    pc.close();
    throw error;
  }

  return {
    kind: "webrtc",
    send: (event) => { if (channel.readyState === "open") channel.send(JSON.stringify(event)); },
    setVideoTrack: (track) => video.sender.replaceTrack(track),
    outputAnalyser,
    close() {
      closed = true;
      channel.onclose = null;
      pc.close();
      audioElement.srcObject = null;
    },
  };
}
