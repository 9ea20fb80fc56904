// The playground page: chat, settings, server panel. See radixlm/entrypoints/playground/routes.py.
//
// The conversation lives in `state.history` ({role, content, images}); each
// answer streams from /v1/chat/completions with continuous usage stats, so the
// token counts are known even for an answer stopped half-way. Model text only
// ever reaches the page through markdown.js (text nodes, no HTML parsing).

import { ApiError, getApiKey, getJson, setApiKey, streamChat } from "./api.js";
import { renderMarkdown, renderVerbatim } from "./markdown.js";
import {
  InputError, JSON_MODES, SETTINGS, buildRequest, checkFormat, loadSettings, saveSettings,
  showFormatFields,
} from "./settings.js";

const $ = (id) => document.getElementById(id);

const MAX_IMAGE_BYTES = 20 * 1024 * 1024; // the server's default --max-media-bytes

const state = {
  model: null,        // served model name, from /get_model_info
  ready: false,
  history: [],        // {role: "user" | "assistant", content, images?, node}
  running: null,      // {controller} while an answer streams
  attachments: [],    // image data URLs for the next message
  pollTimer: null,
  atEnd: true,        // the chat is scrolled to its end
  epoch: 0,           // bumped by Clear: an answer from before it is dropped
};

// ------------------------------------------------------------------ messages

// Follow the newest text while the reader is at the end (state.atEnd, kept by scrolling).
function scrollToEnd(force = false) {
  const box = $("messages");
  if (force || state.atEnd) {
    box.scrollTop = box.scrollHeight;
    state.atEnd = true;
  }
}

function addMessage(role) {
  $("empty-hint").hidden = true;
  const node = document.createElement("div");
  node.className = `msg ${role}`;
  const who = document.createElement("div");
  who.className = "msg-role";
  who.textContent = role === "error" ? "error" : role;
  const body = document.createElement("div");
  body.className = "msg-body";
  const stats = document.createElement("div");
  stats.className = "msg-stats";
  node.append(who, body, stats);
  $("messages").append(node);
  scrollToEnd(true);
  return { node, body, stats };
}

function addUserMessage(entry) {
  const view = addMessage("user");
  view.body.textContent = entry.content;
  if (entry.images && entry.images.length) {
    const row = document.createElement("div");
    row.className = "msg-images";
    for (const url of entry.images) {
      const img = document.createElement("img");
      img.src = url;
      img.alt = "attached image";
      row.append(img);
    }
    view.body.append(row);
  }
  entry.node = view.node;
}

function showError(message, status) {
  const view = addMessage("error");
  view.node.setAttribute("role", "alert");
  if (status) view.node.dataset.status = String(status);
  view.body.textContent = status ? `${status}: ${message}` : message;
  scrollToEnd(true);
  updateButtons();
}

function renderAnswer(body, text, mode, streaming) {
  if (JSON_MODES.has(mode)) renderVerbatim(text, body, "json");
  else renderMarkdown(text, body);
  body.classList.toggle("streaming", streaming);
  if (streaming) {
    // The caret goes at the end of the innermost last element, after the newest text.
    let target = body;
    while (target.lastElementChild && target.lastElementChild.tagName !== "BR"
           && !target.lastElementChild.classList.contains("code-bar")) {
      target = target.lastElementChild;
    }
    const caret = document.createElement("span");
    caret.className = "caret";
    caret.setAttribute("aria-hidden", "true");
    target.append(caret);
  }
}

function stat(parent, key, text, title) {
  const span = document.createElement("span");
  span.dataset.stat = key;
  span.textContent = text;
  if (title) span.title = title;
  parent.append(span);
}

function showStats(view, run, done) {
  const { usage, finish, matched, stopped, t0, tFirst, tLast, text, mode } = run;
  view.stats.replaceChildren();
  const tokens = usage ? usage.completion_tokens : null;
  if (tokens !== null) stat(view.stats, "tokens", `${tokens} tokens`);
  if (tokens > 1 && tLast > tFirst) {
    const rate = (tokens - 1) / ((tLast - tFirst) / 1000);
    stat(view.stats, "speed", `${rate.toFixed(1)} tok/s`, "Decode speed after the first token");
  }
  if (tFirst !== null) {
    stat(view.stats, "ttft", `TTFT ${Math.round(tFirst - t0)} ms`, "Time to first token");
  }
  if (usage) {
    const cached = usage.prompt_tokens_details?.cached_tokens ?? 0;
    stat(view.stats, "cached", `cached ${cached}/${usage.prompt_tokens} prompt`,
      "Prompt tokens found in the radix (prefix) cache");
    const jumped = usage.completion_tokens_details?.jump_forward_tokens ?? 0;
    stat(view.stats, "jump", `jump-forward ${jumped}`,
      "Tokens the grammar forced, appended without sampling");
  }
  if (done || finish) {
    let reason = stopped ? "stopped" : (finish || "none");
    if (typeof matched === "string" && finish === "stop") reason += ` (${JSON.stringify(matched)})`;
    stat(view.stats, "finish", `finish: ${reason}`);
  } else {
    stat(view.stats, "finish", "streaming…");
  }
  if (done && JSON_MODES.has(mode) && !stopped) {
    let ok = true;
    try {
      JSON.parse(text);
    } catch {
      ok = false;
    }
    stat(view.stats, "json", ok ? "valid JSON" : "not valid JSON");
    view.stats.lastChild.classList.add(ok ? "good" : "bad");
  }
}

// ------------------------------------------------------------------ answering

function setRunning(running) {
  $("send").hidden = running;
  $("stop").hidden = !running;
  document.body.classList.toggle("running", running);
  updateButtons();
  refreshServerSoon();
}

function updateButtons() {
  const idle = !state.running;
  $("regenerate").disabled = !idle || !state.history.length;
  $("clear").disabled = $("messages").querySelector(".msg") === null;
}

// The request for the current history and settings, or null after showing why not.
function requestOrReport() {
  try {
    return buildRequest(state.history, state.model);
  } catch (e) {
    if (!(e instanceof InputError)) throw e;
    e.field?.setAttribute("aria-invalid", "true");
    // On a narrow screen the settings are a drawer: open it at the field to fix.
    if (e.field?.closest(".settings") && matchMedia("(max-width: 820px)").matches) {
      toggleSettings(true);
    }
    showError(`Not sent: ${e.message}`);
    return null;
  }
}

async function answer() {
  const body = requestOrReport();
  if (body === null) return;
  const mode = $("format").value;
  const view = addMessage("assistant");
  view.node.dataset.mode = mode;
  view.body.classList.add("streaming");
  const controller = new AbortController();
  const epoch = state.epoch;
  state.running = { controller };
  setRunning(true);
  const run = { usage: null, finish: null, matched: null, stopped: false, text: "", mode,
    t0: performance.now(), tFirst: null, tLast: null };
  let paintTimer = null;
  const paint = () => {
    paintTimer = null;
    renderAnswer(view.body, run.text, mode, true);
    showStats(view, run, false);
    scrollToEnd();
  };
  let failure = null;
  try {
    for await (const chunk of streamChat(body, controller.signal)) {
      if (chunk.usage) run.usage = chunk.usage;
      for (const choice of chunk.choices || []) {
        const piece = choice.delta && choice.delta.content;
        if (piece) {
          run.text += piece;
          run.tLast = performance.now();
          if (run.tFirst === null) run.tFirst = run.tLast;
        }
        if (choice.finish_reason) {
          run.finish = choice.finish_reason;
          run.matched = choice.matched_stop;
        }
      }
      if (paintTimer === null) paintTimer = setTimeout(paint, 30);
    }
  } catch (e) {
    if (e.name === "AbortError") run.stopped = true;
    else failure = e;
  } finally {
    clearTimeout(paintTimer);
    state.running = null;
  }
  if (epoch !== state.epoch) {
    setRunning(false); // cleared while it ran: the answer is gone with the conversation
    return;
  }
  if (failure && !run.text) {
    view.node.remove();
    reportFailure(failure);
  } else {
    renderAnswer(view.body, run.text, mode, false);
    showStats(view, run, true);
    view.node.classList.add("done");
    // An answer stopped before its first token stays on screen but not in the history.
    if (run.text) state.history.push({ role: "assistant", content: run.text, node: view.node });
    if (failure) reportFailure(failure);
  }
  setRunning(false);
  scrollToEnd();
}

function reportFailure(e) {
  if (e instanceof ApiError) {
    showError(e.message, e.status);
    if (e.status === 401) askKey(true);
  } else {
    showError(`The server could not be reached (${e.message})`);
  }
}

function send() {
  if (state.running || !state.ready) return;
  const content = $("prompt").value.trim();
  if (!content && !state.attachments.length) return;
  checkFormat();
  if (requestOrReport() === null) return; // nothing is added to the conversation
  const entry = { role: "user", content, images: state.attachments };
  state.history.push(entry);
  addUserMessage(entry);
  state.attachments = [];
  showAttachments();
  $("prompt").value = "";
  autoGrow();
  answer();
}

function stop() {
  if (state.running) state.running.controller.abort();
}

function regenerate() {
  if (state.running || !state.history.length) return;
  let last = state.history[state.history.length - 1];
  if (last.role === "assistant") {
    state.history.pop();
    last = state.history[state.history.length - 1];
  }
  // Drop everything shown after the last user message (the old answer, errors).
  if (last && last.node) {
    while (last.node.nextSibling) last.node.nextSibling.remove();
  }
  if (last) answer();
}

function clearChat() {
  stop();
  state.epoch += 1;
  state.history = [];
  for (const node of [...$("messages").querySelectorAll(".msg")]) node.remove();
  $("empty-hint").hidden = false;
  updateButtons();
}

// ------------------------------------------------------------------ images

function showAttachments() {
  const box = $("attachments");
  box.replaceChildren();
  state.attachments.forEach((url, i) => {
    const item = document.createElement("div");
    item.className = "attachment";
    const img = document.createElement("img");
    img.src = url;
    img.alt = `image ${i + 1}`;
    const remove = document.createElement("button");
    remove.type = "button";
    remove.textContent = "×";
    remove.title = "Remove";
    remove.addEventListener("click", () => {
      state.attachments.splice(i, 1);
      showAttachments();
    });
    item.append(img, remove);
    box.append(item);
  });
  box.hidden = state.attachments.length === 0;
}

function addImageFiles(files) {
  for (const file of files) {
    if (!file.type.startsWith("image/")) continue;
    if (file.size > MAX_IMAGE_BYTES) {
      showError(`${file.name} is larger than ${MAX_IMAGE_BYTES >> 20} MiB`);
      continue;
    }
    const reader = new FileReader();
    reader.onload = () => {
      state.attachments.push(String(reader.result));
      showAttachments();
    };
    reader.readAsDataURL(file);
  }
}

// ------------------------------------------------------------------ server

function showServer(info) {
  const total = info.max_total_num_tokens || 0;
  const used = info.num_used_tokens ?? 0;
  $("srv-running").textContent = String(info.num_running_reqs ?? 0);
  $("srv-waiting").textContent = String(info.num_waiting_reqs ?? 0);
  $("srv-kv-used").textContent = String(used);
  $("srv-kv-free").textContent = String(info.num_free_tokens ?? 0);
  $("srv-kv-cached").textContent = String(info.num_cached_tokens ?? 0);
  $("srv-kv-fill").style.width = total ? `${Math.min(100, (100 * used) / total)}%` : "0";
  $("srv-state").textContent = "";
  $("server-panel").dataset.idle = String(used === 0 && !info.num_running_reqs
    && !info.num_waiting_reqs);
}

async function pollServer() {
  clearTimeout(state.pollTimer);
  state.pollTimer = null;
  if (state.ready) {
    try {
      showServer(await getJson("/get_server_info"));
    } catch (e) {
      $("srv-state").textContent = e instanceof ApiError ? e.message : "unreachable";
      if (e instanceof ApiError && e.status === 401) askKey(true);
    }
  }
  const delay = document.hidden ? 5000 : (state.running ? 500 : 1500);
  state.pollTimer = setTimeout(pollServer, delay);
}

function refreshServerSoon() {
  clearTimeout(state.pollTimer);
  state.pollTimer = setTimeout(pollServer, 50);
}

async function connect() {
  try {
    const info = await getJson("/get_model_info");
    state.model = info.served_model_name || null;
    state.ready = true;
    $("model-name").textContent = state.model || "model";
    $("model-name").title = `${info.model_path || ""} · context ${info.context_length ?? "?"}`;
    $("attach").hidden = !info.has_image_understanding;
    $("srv-state").textContent = "";
    document.body.dataset.ready = "true";
    updateButtons();
    pollServer();
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) {
      askKey(Boolean(getApiKey()));
      return;
    }
    $("srv-state").textContent = e instanceof ApiError ? e.message : "server unreachable";
    setTimeout(connect, 2000); // loading (503) or restarting
  }
}

function askKey(refused) {
  $("key-reason").textContent = refused
    ? "The server refused this API key. Enter the key it was started with (--api-key)."
    : "This server was started with --api-key. Enter the key to use it.";
  $("key-dialog").hidden = false;
  $("key-input").focus();
}

// ------------------------------------------------------------------ wiring

function autoGrow() {
  const box = $("prompt");
  box.style.height = "auto";
  const borders = box.offsetHeight - box.clientHeight;
  box.style.height = `${Math.min(box.scrollHeight + borders, 200)}px`;
}

function toggleSettings(open) {
  document.body.classList.toggle("settings-open", open);
  $("settings-toggle").setAttribute("aria-expanded", String(open));
}

function wire() {
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    send();
  });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    }
  });
  $("prompt").addEventListener("input", autoGrow);
  $("messages").addEventListener("scroll", () => {
    const box = $("messages");
    state.atEnd = box.scrollHeight - box.scrollTop - box.clientHeight < 60;
  }, { passive: true });
  new ResizeObserver(() => scrollToEnd()).observe($("messages"));
  $("prompt").addEventListener("paste", (e) => {
    if ($("attach").hidden) return;
    const files = [...(e.clipboardData?.files || [])].filter((f) => f.type.startsWith("image/"));
    if (files.length) {
      e.preventDefault();
      addImageFiles(files);
    }
  });
  document.addEventListener("keydown", (e) => {
    if (e.key !== "Escape") return;
    if (state.running) {
      e.preventDefault();
      stop();
    } else if (document.body.classList.contains("settings-open")) {
      toggleSettings(false);
    }
  });
  $("stop").addEventListener("click", stop);
  $("regenerate").addEventListener("click", regenerate);
  $("clear").addEventListener("click", clearChat);
  $("attach").addEventListener("click", () => $("image-input").click());
  $("image-input").addEventListener("change", () => {
    addImageFiles($("image-input").files);
    $("image-input").value = "";
  });
  $("composer").addEventListener("dragover", (e) => {
    if (!$("attach").hidden) e.preventDefault();
  });
  $("composer").addEventListener("drop", (e) => {
    if ($("attach").hidden) return;
    e.preventDefault();
    addImageFiles(e.dataTransfer.files);
  });
  $("format").addEventListener("change", showFormatFields);
  for (const id of ["format-schema", "format-regex", "format-ebnf"]) {
    $(id).addEventListener("input", checkFormat);
  }
  for (const id of SETTINGS) {
    $(id).addEventListener("change", saveSettings);
    $(id).addEventListener("input", () => $(id).removeAttribute("aria-invalid"));
  }
  $("settings-toggle").addEventListener("click",
    () => toggleSettings(!document.body.classList.contains("settings-open")));
  $("settings-close").addEventListener("click", () => toggleSettings(false));
  $("key-form").addEventListener("submit", (e) => {
    e.preventDefault();
    setApiKey($("key-input").value.trim());
    $("key-input").value = "";
    $("key-dialog").hidden = true;
    if (state.ready) pollServer();
    else connect();
  });
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) refreshServerSoon();
  });
}

loadSettings();
wire();
showFormatFields();
autoGrow();
connect();
$("prompt").focus();
