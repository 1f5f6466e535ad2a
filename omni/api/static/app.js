// omni playground: talk (microphone, server VAD) or type to /v1/realtime; hear the answer as it streams.
// Plain browser JavaScript, no build step. The socket speaks the GA dialect of OpenAI's Realtime API
// (browsers cannot send the OpenAI-Beta header); the API key, if any, rides as a subprotocol.
"use strict";

const RATE = 24000; // pcm16 both ways
const APPEND_SAMPLES = 2400; // 100 ms per input_audio_buffer.append
const $ = (id) => document.getElementById(id);

const ui = {
  ws: null, models: [], outCtx: null, nextTime: 0, sources: [],
  mic: null, // {ctx, stream, node, pending: Float32Array[], pendingLen}
  answer: null, // the assistant item playing: {itemId, el, startTime, sentMs, firstAudio}
  bubbles: new Map(), // item id -> element
  turnStart: null, // performance.now() when the user's turn ended
  audioBytes: 0, turns: 0,
};

function setStatus(text, state) {
  const el = $("status");
  el.textContent = text;
  el.dataset.state = state;
}

function headers() {
  const key = $("key").value.trim();
  return key ? { Authorization: "Bearer " + key } : {};
}

async function loadModels() {
  try {
    const res = await fetch("/v1/models", { headers: headers() });
    if (!res.ok) throw new Error("HTTP " + res.status);
    const cards = (await res.json()).data;
    ui.models = cards.filter((m) => m.id === m.root && m.chats);
    const select = $("model");
    select.innerHTML = "";
    for (const m of ui.models) select.add(new Option(m.id + (m.random_weights ? " (random weights)" : ""), m.id));
    fillVoices();
  } catch (err) {
    setStatus("cannot list models: " + err.message, "error");
  }
}

function fillVoices() {
  const card = ui.models.find((m) => m.id === $("model").value);
  const select = $("voice");
  select.innerHTML = "";
  for (const v of (card && card.voices) || []) select.add(new Option(v, v));
  select.disabled = !card || !card.speaks;
}

function speaks() {
  const card = ui.models.find((m) => m.id === $("model").value);
  return !!(card && card.speaks);
}

// ---- the socket -------------------------------------------------------------------------------

function send(event) {
  if (ui.ws && ui.ws.readyState === WebSocket.OPEN) ui.ws.send(JSON.stringify(event));
}

function connect() {
  if (ui.ws) { ui.ws.close(); return; }
  ui.outCtx = ui.outCtx || new AudioContext({ sampleRate: RATE });
  ui.outCtx.resume();
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const protocols = ["realtime"];
  const key = $("key").value.trim();
  if (key) protocols.push("openai-insecure-api-key." + key);
  const ws = new WebSocket(`${scheme}://${location.host}/v1/realtime?model=${encodeURIComponent($("model").value)}`,
                           protocols);
  ui.ws = ws;
  setStatus("connecting…", "connecting");
  ws.onopen = () => {
    const format = { type: "audio/pcm", rate: RATE };
    const output = { format };
    if (speaks() && $("voice").value) output.voice = $("voice").value;
    send({ type: "session.update", session: {
      type: "realtime", instructions: $("instructions").value,
      output_modalities: speaks() ? ["audio"] : ["text"],
      audio: { input: { format, transcription: { model: "whisper-1" },
                        turn_detection: { type: "server_vad", threshold: 0.5, silence_duration_ms: 500,
                                          prefix_padding_ms: 300 } },
               output },
    } });
  };
  ws.onmessage = (msg) => onEvent(JSON.parse(msg.data));
  ws.onclose = (ev) => {
    ui.ws = null;
    stopMic();
    stopPlayback();
    setStatus(`disconnected (${ev.code})`, ev.code === 1000 ? "idle" : "error");
    $("connect").textContent = "Connect";
    for (const id of ["mic", "text", "send"]) $(id).disabled = true;
  };
}

function onEvent(ev) {
  switch (ev.type) {
    case "session.created":
      break;
    case "session.updated":
      setStatus("connected: " + ev.session.model, "connected");
      $("connect").textContent = "Disconnect";
      for (const id of ["mic", "text", "send"]) $(id).disabled = false;
      break;
    case "input_audio_buffer.speech_started":
      $("vad").textContent = "speaking…";
      $("vad").dataset.speaking = "true";
      bargeIn();
      break;
    case "input_audio_buffer.speech_stopped":
      $("vad").textContent = "listening";
      $("vad").dataset.speaking = "false";
      ui.turnStart = performance.now();
      break;
    case "conversation.item.added":
    case "conversation.item.created":
      if (ev.item.role === "user") userBubble(ev.item);
      break;
    case "conversation.item.input_audio_transcription.completed": {
      const el = ui.bubbles.get(ev.item_id);
      if (el) el.querySelector(".text").textContent = ev.transcript || "(silence)";
      break;
    }
    case "conversation.item.input_audio_transcription.failed": {
      const el = ui.bubbles.get(ev.item_id);
      if (el) el.querySelector(".text").textContent = "(spoken; not transcribed)";
      break;
    }
    case "response.output_item.added":
      answerBubble(ev.item.id);
      break;
    case "response.output_audio_transcript.delta":
    case "response.output_text.delta":
    case "response.audio_transcript.delta":
    case "response.text.delta": {
      const el = ui.bubbles.get(ev.item_id) || answerBubble(ev.item_id);
      el.querySelector(".text").textContent += ev.delta;
      if (!speaks()) firstOutput(el);
      break;
    }
    case "response.output_audio.delta":
    case "response.audio.delta":
      play(ev.item_id, ev.delta);
      break;
    case "response.done": {
      const out = ev.response.output && ev.response.output[0];
      const el = out && ui.bubbles.get(out.id);
      if (el && ev.response.status === "cancelled") el.classList.add("cancelled");
      if (el) el.dataset.status = ev.response.status;
      ui.turns += 1;
      $("turns").textContent = ui.turns;
      break;
    }
    case "error":
      console.warn("realtime error", ev.error);
      setStatus("error: " + ev.error.message, "connected");
      break;
  }
}

// ---- the conversation on the page --------------------------------------------------------------

function bubble(role, id) {
  const el = document.createElement("div");
  el.className = "turn " + role;
  el.dataset.itemId = id;
  el.innerHTML = `<span class="who">${role === "user" ? "you" : "assistant"}</span><span class="ttfa"></span>` +
                 `<div class="text"></div>`;
  $("conversation").appendChild(el);
  el.scrollIntoView({ block: "end" });
  ui.bubbles.set(id, el);
  return el;
}

function userBubble(item) {
  if (ui.bubbles.has(item.id)) return;
  const el = bubble("user", item.id);
  const part = item.content && item.content[0];
  el.querySelector(".text").textContent = part && part.type === "input_text" ? part.text : "(speaking…)";
}

function answerBubble(itemId) {
  return ui.bubbles.get(itemId) || bubble("assistant", itemId);
}

function firstOutput(el) {
  if (el.dataset.ttfaMs || ui.turnStart === null) return;
  const ms = Math.round(performance.now() - ui.turnStart);
  el.dataset.ttfaMs = String(ms);
  el.querySelector(".ttfa").textContent = `first ${speaks() ? "audio" : "text"} after ${ms} ms`;
}

function typed(e) {
  e.preventDefault();
  const text = $("text").value.trim();
  if (!text) return;
  $("text").value = "";
  bargeIn();
  send({ type: "conversation.item.create", item: { type: "message", role: "user",
                                                    content: [{ type: "input_text", text }] } });
  ui.turnStart = performance.now();
  send({ type: "response.create" });
}

// ---- playing the answer -------------------------------------------------------------------------

function play(itemId, b64) {
  const raw = atob(b64);
  const n = raw.length >> 1;
  if (!n) return;
  const pcm = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    let v = raw.charCodeAt(2 * i) | (raw.charCodeAt(2 * i + 1) << 8);
    if (v >= 0x8000) v -= 0x10000;
    pcm[i] = v / 32768;
  }
  ui.audioBytes += raw.length;
  $("audio-bytes").textContent = ui.audioBytes;
  const el = answerBubble(itemId);
  firstOutput(el);
  if (!ui.answer || ui.answer.itemId !== itemId) ui.answer = { itemId, el, startTime: null, sentMs: 0 };
  ui.answer.sentMs += Math.floor((raw.length * 1000) / (2 * RATE)); // as the server counts it
  const ctx = ui.outCtx;
  const buf = ctx.createBuffer(1, n, RATE);
  buf.copyToChannel(pcm, 0);
  const src = ctx.createBufferSource();
  src.buffer = buf;
  src.connect(ctx.destination);
  const at = Math.max(ctx.currentTime + 0.03, ui.nextTime);
  src.start(at);
  ui.nextTime = at + buf.duration;
  if (ui.answer.startTime === null) ui.answer.startTime = at;
  ui.sources.push(src);
  src.onended = () => { ui.sources = ui.sources.filter((s) => s !== src); };
}

function stopPlayback() {
  for (const s of ui.sources) { try { s.stop(); } catch (_) { /* already stopped */ } }
  ui.sources = [];
  ui.nextTime = 0;
}

// The user talks over the answer: stop playing it and tell the server how much was heard.
function bargeIn() {
  const answer = ui.answer;
  if (!answer || !ui.sources.length) return;
  const heard = Math.max(0, Math.floor((ui.outCtx.currentTime - answer.startTime) * 1000));
  stopPlayback();
  send({ type: "conversation.item.truncate", item_id: answer.itemId, content_index: 0,
         audio_end_ms: Math.min(heard, answer.sentMs) });
  answer.el.classList.add("cancelled");
  ui.answer = null;
}

// ---- the microphone -----------------------------------------------------------------------------

async function toggleMic() {
  if (ui.mic) { stopMic(); return; }
  try {
    const stream = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true } });
    const ctx = new AudioContext({ sampleRate: RATE });
    const source = ctx.createMediaStreamSource(stream);
    const mute = ctx.createGain();
    mute.gain.value = 0;
    mute.connect(ctx.destination);
    const mic = { ctx, stream, pending: [], pendingLen: 0, node: null };
    if (ctx.audioWorklet) {
      await ctx.audioWorklet.addModule("/static/capture-worklet.js");
      mic.node = new AudioWorkletNode(ctx, "pcm-capture");
      mic.node.port.onmessage = (e) => capture(e.data, ctx.sampleRate);
    } else { // older browsers
      mic.node = ctx.createScriptProcessor(2048, 1, 1);
      mic.node.onaudioprocess = (e) => capture(new Float32Array(e.inputBuffer.getChannelData(0)), ctx.sampleRate);
    }
    source.connect(mic.node);
    mic.node.connect(mute);
    ui.mic = mic;
    $("mic").textContent = "Stop microphone";
    $("vad").textContent = "listening";
  } catch (err) {
    setStatus("microphone: " + err.message, "error");
  }
}

function stopMic() {
  const mic = ui.mic;
  if (!mic) return;
  ui.mic = null;
  mic.stream.getTracks().forEach((t) => t.stop());
  mic.ctx.close();
  $("mic").textContent = "Start microphone";
  $("vad").textContent = "mic off";
}

function capture(samples, rate) {
  const mic = ui.mic;
  if (!mic) return;
  const pcm = rate === RATE ? samples : resample(samples, rate);
  mic.pending.push(pcm);
  mic.pendingLen += pcm.length;
  if (mic.pendingLen < APPEND_SAMPLES) return;
  const all = new Float32Array(mic.pendingLen);
  let at = 0;
  for (const p of mic.pending) { all.set(p, at); at += p.length; }
  mic.pending = [];
  mic.pendingLen = 0;
  send({ type: "input_audio_buffer.append", audio: pcm16Base64(all) });
}

function resample(samples, rate) { // linear, for a context that would not run at 24 kHz
  const n = Math.floor((samples.length * RATE) / rate);
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    const x = (i * rate) / RATE;
    const j = Math.floor(x);
    const f = x - j;
    out[i] = samples[j] * (1 - f) + (samples[Math.min(j + 1, samples.length - 1)] || 0) * f;
  }
  return out;
}

function pcm16Base64(f32) {
  const bytes = new Uint8Array(f32.length * 2);
  for (let i = 0; i < f32.length; i++) {
    const v = Math.max(-1, Math.min(1, f32[i]));
    const s = Math.round(v < 0 ? v * 0x8000 : v * 0x7fff);
    bytes[2 * i] = s & 0xff;
    bytes[2 * i + 1] = (s >> 8) & 0xff;
  }
  let bin = "";
  for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  return btoa(bin);
}

// ---- wiring -------------------------------------------------------------------------------------

$("model").addEventListener("change", fillVoices);
$("key").addEventListener("change", loadModels);
$("connect").addEventListener("click", connect);
$("mic").addEventListener("click", toggleMic);
$("typed").addEventListener("submit", typed);
loadModels();
