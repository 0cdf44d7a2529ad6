// AudioWorklet processors of the WebSocket transport (loaded with audioWorklet.addModule).
//
// The AudioContext runs at the device's rate (44.1 or 48 kHz): Firefox refuses to connect a
// microphone to a context at another rate, so both processors resample themselves.
//
// - "omni-capture": microphone → mono → 24 kHz → Int16 chunks of `chunkMs` posted to the page.
// - "omni-playback": 24 kHz Float32 chunks from the page → the context's rate, behind a jitter
//   buffer: playback starts once `prebufferMs` is queued (or the reply ended), and after an
//   underrun it waits to refill rather than clicking through a trickle of samples.

const PHASES = 256; // fractional positions of the interpolation kernel cached per resampler

// Streaming windowed-sinc resampler (Hann window), mono Float32. The kernel is widened when
// downsampling so it also low-passes below the new Nyquist frequency (no aliasing).
class SincResampler {
  constructor(inRate, outRate, zeroCrossings = 12) {
    this.step = inRate / outRate; // input samples advanced per output sample
    this.cutoff = Math.min(1, outRate / inRate) * 0.92; // of the input Nyquist, with a guard band
    this.taps = Math.ceil(zeroCrossings / this.cutoff); // kernel half-width, input samples
    this.kernels = new Map();
    this.reset();
  }

  reset() {
    this.history = new Float32Array(this.taps); // left context: silence before the signal
    this.pos = this.taps; // position of the next output sample in `history` coordinates
  }

  kernel(frac) {
    const phase = Math.round(frac * PHASES);
    let weights = this.kernels.get(phase);
    if (!weights) {
      weights = new Float32Array(2 * this.taps);
      let sum = 0;
      for (let i = 0; i < weights.length; i++) {
        const t = i - this.taps + 1 - phase / PHASES; // distance from the output position
        const x = this.cutoff * t;
        const sinc = x === 0 ? 1 : Math.sin(Math.PI * x) / (Math.PI * x);
        const window = Math.abs(t) >= this.taps ? 0 : 0.5 * (1 + Math.cos((Math.PI * t) / this.taps));
        weights[i] = sinc * window;
        sum += weights[i];
      }
      for (let i = 0; i < weights.length; i++) weights[i] /= sum; // unit gain at DC
      this.kernels.set(phase, weights);
    }
    return weights;
  }

  process(input) {
    const buf = new Float32Array(this.history.length + input.length);
    buf.set(this.history);
    buf.set(input, this.history.length);
    const out = [];
    while (Math.floor(this.pos) + this.taps < buf.length) {
      const center = Math.floor(this.pos);
      const weights = this.kernel(this.pos - center);
      const first = center - this.taps + 1;
      let acc = 0;
      for (let i = 0; i < weights.length; i++) acc += buf[first + i] * weights[i];
      out.push(acc);
      this.pos += this.step;
    }
    const keep = Math.max(0, Math.floor(this.pos) - this.taps + 1);
    this.history = buf.slice(keep);
    this.pos -= keep;
    return Float32Array.from(out);
  }

  // The samples still held back (the right context of the last ones), then start afresh.
  flush() {
    const tail = this.process(new Float32Array(this.taps + 1));
    this.reset();
    return tail;
  }
}

class CaptureProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const { targetRate = 24000, chunkMs = 20 } = options.processorOptions || {};
    this.resampler = new SincResampler(sampleRate, targetRate);
    this.chunk = Math.round((targetRate * chunkMs) / 1000);
    this.pending = new Float32Array(0);
  }

  process(inputs) {
    const channels = inputs[0];
    if (!channels || channels.length === 0) return true;
    const mono = new Float32Array(channels[0].length);
    for (const channel of channels) for (let i = 0; i < mono.length; i++) mono[i] += channel[i] / channels.length;
    const resampled = this.resampler.process(mono);
    const joined = new Float32Array(this.pending.length + resampled.length);
    joined.set(this.pending);
    joined.set(resampled, this.pending.length);
    let offset = 0;
    for (; offset + this.chunk <= joined.length; offset += this.chunk) {
      const pcm = new Int16Array(this.chunk);
      for (let i = 0; i < this.chunk; i++) {
        const s = Math.max(-1, Math.min(1, joined[offset + i]));
        pcm[i] = s < 0 ? Math.round(s * 32768) : Math.round(s * 32767);
      }
      this.port.postMessage(pcm, [pcm.buffer]);
    }
    this.pending = joined.slice(offset);
    return true;
  }
}

// Messages in: {type: "audio", itemId, samples: Float32Array at inputRate}, {type: "end"} (the
// reply's audio is complete: play out what is queued), {type: "clear"} (drop everything now).
// Messages out: {type: "progress" | "cleared" | "drained", itemId, playedMs} (ms of the item's
// audio actually played, for conversation.item.truncate), {type: "underrun"}.
class PlaybackProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const { inputRate = 24000, prebufferMs = 120 } = options.processorOptions || {};
    this.inputRate = inputRate;
    this.resampler = new SincResampler(inputRate, sampleRate);
    this.prebuffer = Math.round((sampleRate * prebufferMs) / 1000);
    this.queue = []; // {itemId, samples, offset}
    this.queued = 0;
    this.playing = false;
    this.ending = false;
    this.item = null; // {id, played: output samples played}
    this.sinceProgress = 0;
    this.port.onmessage = (event) => this.onMessage(event.data);
  }

  onMessage(message) {
    if (message.type === "audio") {
      this.enqueue(message.itemId, this.resampler.process(message.samples));
      this.ending = false;
    } else if (message.type === "end") {
      this.enqueue(this.lastItemId(), this.resampler.flush());
      this.ending = true;
    } else if (message.type === "clear") {
      this.queue = [];
      this.queued = 0;
      this.playing = false;
      this.ending = false;
      this.resampler.reset();
      this.report("cleared");
    }
  }

  lastItemId() {
    return this.queue.length ? this.queue[this.queue.length - 1].itemId : this.item && this.item.id;
  }

  enqueue(itemId, samples) {
    if (samples.length === 0) return;
    this.queue.push({ itemId, samples, offset: 0 });
    this.queued += samples.length;
  }

  report(type) {
    const item = this.item;
    const playedMs = item ? (1000 * item.played) / sampleRate : 0;
    this.port.postMessage({ type, itemId: item ? item.id : null, playedMs });
  }

  process(_inputs, outputs) {
    const out = outputs[0][0];
    if (!this.playing && this.queued > 0 && (this.queued >= this.prebuffer || this.ending)) this.playing = true;
    let written = 0;
    while (this.playing && written < out.length && this.queue.length) {
      const head = this.queue[0];
      if (!this.item || this.item.id !== head.itemId) this.item = { id: head.itemId, played: 0 };
      const n = Math.min(out.length - written, head.samples.length - head.offset);
      out.set(head.samples.subarray(head.offset, head.offset + n), written);
      head.offset += n;
      written += n;
      this.queued -= n;
      this.item.played += n;
      if (head.offset === head.samples.length) this.queue.shift();
    }
    out.fill(0, written);
    if (this.playing && this.queued === 0) {
      this.playing = false; // a reply that ended was played out; otherwise an underrun
      this.report(this.ending ? "drained" : "underrun");
      this.ending = false;
    }
    this.sinceProgress += written;
    if (this.sinceProgress >= sampleRate / 10 && this.item) {
      this.sinceProgress = 0;
      this.report("progress");
    }
    return true;
  }
}

registerProcessor("omni-capture", CaptureProcessor);
registerProcessor("omni-playback", PlaybackProcessor);
