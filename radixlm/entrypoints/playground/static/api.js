// The server's HTTP API as the playground uses it: JSON calls and one streaming chat.
//
// Every call sends the API key when one is set. A non-2xx answer becomes an
// ApiError that carries the server's OpenAI error body (message, type, param).
// A stream is read with fetch + ReadableStream (POST bodies rule out EventSource);
// aborting its AbortSignal closes the connection, which aborts the request on
// the server and frees its KV cache.

const KEY_STORAGE = "radixlm.apiKey";

export class ApiError extends Error {
  constructor(status, body) {
    const message = (body && typeof body.message === "string") ? body.message : `HTTP ${status}`;
    super(message);
    this.status = status;
    this.body = body;
  }
}

export function getApiKey() {
  try {
    return localStorage.getItem(KEY_STORAGE) || "";
  } catch {
    return "";
  }
}

export function setApiKey(key) {
  try {
    if (key) localStorage.setItem(KEY_STORAGE, key);
    else localStorage.removeItem(KEY_STORAGE);
  } catch {
    // storage disabled: the key lives for this page only
  }
  sessionKey = key;
}

let sessionKey = getApiKey();

function headers(json) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  if (sessionKey) h["Authorization"] = `Bearer ${sessionKey}`;
  return h;
}

async function errorOf(response) {
  let body = null;
  try {
    const parsed = await response.json();
    body = parsed && parsed.error && typeof parsed.error === "object" ? parsed.error : parsed;
  } catch {
    body = null;
  }
  return new ApiError(response.status, body);
}

export async function getJson(path, signal) {
  const response = await fetch(path, { headers: headers(false), signal, cache: "no-store" });
  if (!response.ok) throw await errorOf(response);
  return response.json();
}

// Split a server-sent-events byte stream into the JSON payloads of its `data:` lines.
async function* sseEvents(body) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") return;
          yield JSON.parse(data);
        }
      }
    }
  } finally {
    reader.releaseLock();
  }
}

// POST /v1/chat/completions with stream: true; yields the parsed chunks.
// Throws ApiError for an HTTP error or an error event in the stream.
export async function* streamChat(body, signal) {
  const response = await fetch("/v1/chat/completions", {
    method: "POST", headers: headers(true), body: JSON.stringify(body), signal,
  });
  if (!response.ok) throw await errorOf(response);
  for await (const chunk of sseEvents(response.body)) {
    if (chunk.error) throw new ApiError(chunk.error.code || 500, chunk.error);
    yield chunk;
  }
}
