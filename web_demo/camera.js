// The camera: a toggle with a local preview, independent of the connection (it can be turned on
// before or during a call).
//
// WebRTC: every call carries a video sender from its start (rtc.js); turning the camera on or off
// swaps that sender's track (replaceTrack), so the call is never renegotiated. The server samples
// the track at its own rate and pixel budget.
//
// WebSocket: there is no video track; `PictureSender` sends still pictures as `input_image` items
// (`conversation.item.create`), the way the Realtime API takes video over a WebSocket: one when the
// server reports that the user started speaking, then one every PICTURE_EVERY_MS while they keep
// speaking; none while they are silent, so a quiet camera adds nothing to the conversation. Each is
// downscaled here to at most PICTURE_PIXELS and sent as a JPEG with `detail: "low"`. After an
// `unsupported_input` error (a model without a vision tower) it sends no more.

export const PICTURE_PIXELS = 256 * 28 * 28; // the server's default low-detail budget: 256 model tokens
export const PICTURE_EVERY_MS = 3000;
const JPEG_QUALITY = 0.8;

// (width, height) scaled down, aspect kept, to at most `budget` pixels.
export function fitPixels(width, height, budget) {
  const scale = Math.min(1, Math.sqrt(budget / (width * height)));
  return [Math.max(1, Math.floor(width * scale)), Math.max(1, Math.floor(height * scale))];
}

export class Camera {
  constructor(preview) {
    this.preview = preview; // a muted <video> showing what the camera sends
    this.stream = null;
    this.onChange = () => {}; // called with the new track (or null) after start/stop
  }

  get track() {
    return this.stream ? this.stream.getVideoTracks()[0] || null : null;
  }

  async start() {
    if (this.stream) return;
    this.stream = await navigator.mediaDevices.getUserMedia({
      video: { width: { ideal: 640 }, height: { ideal: 480 }, frameRate: { ideal: 15 } },
    });
    this.preview.srcObject = this.stream;
    this.preview.hidden = false;
    await this.preview.play().catch((error) => console.warn("preview refused:", error));
    this.onChange(this.track);
  }

  stop() {
    if (!this.stream) return;
    this.stream.getTracks().forEach((track) => track.stop());
    this.stream = null;
    this.preview.srcObject = null;
    this.preview.hidden = true;
    this.onChange(null);
  }

  // The current picture as a JPEG data URI of at most `budget` pixels, or null while the camera is
  // off or has not shown a frame yet.
  snapshot(budget = PICTURE_PIXELS) {
    const { videoWidth, videoHeight } = this.preview;
    if (!this.stream || !videoWidth || !videoHeight) return null;
    const [width, height] = fitPixels(videoWidth, videoHeight, budget);
    const canvas = document.createElement("canvas");
    canvas.width = width;
    canvas.height = height;
    canvas.getContext("2d").drawImage(this.preview, 0, 0, width, height);
    return canvas.toDataURL("image/jpeg", JPEG_QUALITY);
  }
}

// WebSocket only: sends the camera's pictures at the rate described above. `handle(event)` takes
// every server event; `stop()` ends the timer. `onSent(dataUri)` reports each picture sent.
export class PictureSender {
  constructor(camera, send, onSent = () => {}) {
    this.camera = camera;
    this.send = send;
    this.onSent = onSent;
    this.timer = null;
    this.refused = false; // the model cannot see: no more pictures this connection
  }

  handle(event) {
    if (event.type === "error" && event.error.code === "unsupported_input") {
      this.refused = true;
      this.stop();
    } else if (event.type === "input_audio_buffer.speech_started" && !this.refused) {
      this.sendPicture();
      clearInterval(this.timer);
      this.timer = setInterval(() => this.sendPicture(), PICTURE_EVERY_MS);
    } else if (event.type === "input_audio_buffer.speech_stopped") {
      this.stop();
    }
  }

  sendPicture() {
    const url = this.camera.snapshot();
    if (url === null) return;
    this.send({
      type: "conversation.item.create",
      item: { type: "message", role: "user", content: [{ type: "input_image", image_url: url, detail: "low" }] },
    });
    this.onSent(url);
  }

  stop() {
    clearInterval(this.timer);
    this.timer = null;
  }
}
