"""The playground at `/` in headless Chromium, on the session's real server (default model,
started with --api-key), plus one in-process fake server with a vision processor.

The tests share one browser and run in file order on one page: connect with the key,
chat (streaming, multi-turn, regenerate, clear, keyboard), JSON schema, stop, a bad
regex, model markup shown as text, then screenshots of that conversation (desktop and
a 375 px phone) in test-artifacts/playground/. Answers are kept to a few tokens.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from _browser import chromium, screenshot, set_viewport, wait_for
from _server_process import API_KEY, AUTH, ServerProcess, free_port

ANSWER_TIMEOUT = 180.0  # seconds; the CPU is shared with other work in CI
CITY_SCHEMA = {"type": "object",
               "properties": {"city": {"type": "string", "maxLength": 16},
                              "country": {"type": "string", "maxLength": 16}},
               "required": ["city", "country"], "additionalProperties": False}
# Markdown plus markup that must never become elements (forced through a regex).
HOSTILE = ("# Title\n**bold** and `<b>inline</b>`\n"
           "<script>window.__xss = 1</script>\n"
           "<img src=x onerror=\"window.__xss = 2\">\n"
           "```\n<i>verbatim</i>\n```")


def regex_literal(text: str) -> str:
    """A regex matching exactly `text` (escapes only what the grammar compilers need)."""
    out = []
    for ch in text:
        if ch == "\n":
            out.append("\\n")
        elif ch in "\\.^$|?*+()[]{}/":
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    with chromium() as d:
        yield d


@pytest.fixture(scope="module")
def page(driver: Any, server: ServerProcess) -> Any:
    """The playground connected to the real server (the key typed into its dialog)."""
    from selenium.webdriver.common.by import By

    driver.get(server.url + "/")
    dialog = wait_for(driver, lambda d: d.find_element(By.ID, "key-dialog").is_displayed() and
                      d.find_element(By.ID, "key-dialog"), 30, "no API key dialog")
    dialog.find_element(By.ID, "key-input").send_keys(API_KEY + "\n")
    wait_for(driver, lambda d: d.execute_script("return document.body.dataset.ready"), 30,
             "the page did not connect with the key")
    set_field(driver, "temperature", "0")
    set_field(driver, "max_tokens", "12")
    return driver


def set_field(driver: Any, field_id: str, value: str) -> None:
    driver.execute_script(
        "const e = document.getElementById(arguments[0]); e.value = arguments[1];"
        "e.dispatchEvent(new Event('input', {bubbles: true}));"
        "e.dispatchEvent(new Event('change', {bubbles: true}));", field_id, value)


def assistants(driver: Any) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, "#messages .msg.assistant"))


def send(driver: Any, text: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver.find_element(By.ID, "prompt").send_keys(text, Keys.ENTER)


_ANSWER_STATE = """
const msgs = document.querySelectorAll("#messages .msg");
const last = msgs[msgs.length - 1];
if (last && last.classList.contains("error")) return {error: last.textContent};
const node = document.querySelectorAll("#messages .msg.assistant")[arguments[0] - 1];
if (!node) return null;
return {length: node.querySelector(".msg-body").textContent.length,
        done: node.classList.contains("done")};
"""


def wait_answer(driver: Any, count: int) -> Any:
    """The `count`-th answer once it is done; `.lengths`: its text's lengths on the way.
    An error bubble instead fails at once."""
    lengths: list[int] = []

    def done(d: Any) -> bool:
        seen = d.execute_script(_ANSWER_STATE, count)
        if seen and "error" in seen:
            raise AssertionError(f"an error instead of answer {count}: {seen['error']}")
        if seen:
            lengths.append(seen["length"])
        return bool(seen and seen["done"])

    wait_for(driver, done, ANSWER_TIMEOUT, f"answer {count} did not finish")
    node = assistants(driver)[count - 1]
    node.lengths = lengths
    return node


def stat(node: Any, key: str) -> str:
    found = node.find_elements("css selector", f'[data-stat="{key}"]')
    return str(found[0].text) if found else ""


def server_info(server: ServerProcess) -> dict[str, Any]:
    return httpx.get(server.url + "/get_server_info", headers=AUTH, timeout=30).json()  # type: ignore[no-any-return]


def test_connects_and_hides_image_input_for_a_text_model(page: Any) -> None:
    from selenium.webdriver.common.by import By

    assert page.find_element(By.ID, "model-name").text == "SmolLM2-135M-Instruct"
    assert not page.find_element(By.ID, "attach").is_displayed()
    wait_for(page, lambda d: d.find_element(By.ID, "srv-kv-free").text.isdigit(), 10,
             "the server panel shows no KV numbers")


def test_streamed_chat_multi_turn_regenerate_clear(page: Any) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    prompt = page.find_element(By.ID, "prompt")
    prompt.send_keys("Name a colour.")
    ActionChains(page).key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(Keys.SHIFT).perform()
    assert prompt.get_attribute("value") == "Name a colour.\n"  # Shift+Enter: a new line
    assert not assistants(page)
    prompt.clear()
    set_field(page, "max_tokens", "16")
    send(page, "Write two sentences about the sea.")
    first = wait_answer(page, 1)
    grown = [n for n in sorted(set(first.lengths)) if n > 0]
    assert len(grown) >= 3, f"the answer did not stream: {first.lengths}"
    text = first.find_element(By.CSS_SELECTOR, ".msg-body").text
    assert text.strip()
    tokens = int(stat(first, "tokens").split()[0])
    assert 1 < tokens <= 16
    assert stat(first, "finish") in ("finish: stop", "finish: length")
    assert stat(first, "ttft").startswith("TTFT ") and stat(first, "speed").endswith("tok/s")
    assert stat(first, "jump") == "jump-forward 0"

    set_field(page, "max_tokens", "6")
    send(page, "And one about the sky.")
    second = wait_answer(page, 2)
    cached, prompt_len = stat(second, "cached").split()[1].split("/")
    # The second turn's prompt starts with the first turn, which the radix cache holds.
    assert int(cached) > 20 and int(prompt_len) > int(cached), stat(second, "cached")

    page.find_element(By.ID, "regenerate").click()
    wait_for(page, lambda d: len(assistants(d)) == 2 and "done" not in
             (assistants(d)[1].get_attribute("class") or ""), 30, "regenerate did not restart")
    wait_answer(page, 2)
    assert len(page.find_elements(By.CSS_SELECTOR, "#messages .msg.user")) == 2
    page.find_element(By.ID, "clear").click()
    assert not page.find_elements(By.CSS_SELECTOR, "#messages .msg")


def test_json_schema_mode(page: Any) -> None:
    from selenium.webdriver.common.by import By

    set_field(page, "format", "json_schema")
    set_field(page, "format-schema", '{"type": "objekt"}')
    error = page.find_element(By.ID, "format-error")
    assert error.is_displayed() and '"objekt" is not a JSON schema type' in error.text
    send(page, "Where is the Eiffel Tower?")
    assert not page.find_elements(By.CSS_SELECTOR, "#messages .msg.user")  # not sent
    assert "Not sent" in page.find_element(By.CSS_SELECTOR, "#messages .msg.error").text
    page.find_element(By.ID, "clear").click()

    set_field(page, "format-schema", json.dumps(CITY_SCHEMA, indent=2))
    assert not page.find_element(By.ID, "format-error").is_displayed()
    set_field(page, "max_tokens", "60")
    send(page, "Where is the Eiffel Tower? Answer in JSON.")
    node = wait_answer(page, 1)
    code = node.find_element(By.CSS_SELECTOR, ".code-block code").get_attribute("textContent")
    jsonschema.validate(json.loads(code), CITY_SCHEMA)
    assert stat(node, "json") == "valid JSON" and stat(node, "finish") == "finish: stop"
    assert int(stat(node, "jump").split()[1]) > 0  # the keys are forced: jump-forward
    page.find_element(By.ID, "clear").click()
    set_field(page, "format", "text")


def test_stop_mid_stream_frees_the_kv_cache(page: Any, server: ServerProcess) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    set_field(page, "max_tokens", "2000")
    send(page, "Tell me a very long story about a dragon and a knight.")
    seen_running = threading.Event()

    def streaming(d: Any) -> bool:
        used = d.find_element(By.ID, "srv-kv-used").text
        if d.find_element(By.ID, "srv-running").text == "1" and used.isdigit() and int(used):
            seen_running.set()
        bodies = d.find_elements(By.CSS_SELECTOR, "#messages .msg.assistant .msg-body")
        return bool(bodies) and len(bodies[0].get_attribute("textContent")) > 30 and \
            seen_running.is_set()

    wait_for(page, streaming, ANSWER_TIMEOUT, "no long answer streaming with KV in use")
    page.find_element(By.TAG_NAME, "body").send_keys(Keys.ESCAPE)
    node = wait_answer(page, 1)
    assert stat(node, "finish") == "finish: stopped"
    assert 1 < int(stat(node, "tokens").split()[0]) < 2000
    wait_for(page, lambda d: d.find_element(By.ID, "server-panel").get_attribute("data-idle")
             == "true" and d.find_element(By.ID, "srv-kv-used").text == "0", 30,
             "the server panel did not return to idle")
    info = server_info(server)
    assert info["num_used_tokens"] == 0 and info["num_running_reqs"] == 0, info
    set_field(page, "max_tokens", "12")


def test_invalid_regex_shows_the_servers_400(page: Any) -> None:
    from selenium.webdriver.common.by import By

    num_answers = len(assistants(page))
    set_field(page, "format", "regex")
    set_field(page, "format-regex", "(unclosed")
    send(page, "Say something.")
    error = wait_for(page, lambda d: d.find_elements(By.CSS_SELECTOR, "#messages .msg.error"),
                     60, "no error shown for a bad regex")[0]
    assert error.get_attribute("data-status") == "400"
    assert "Failed to compile regex grammar" in error.text
    assert len(assistants(page)) == num_answers  # no answer bubble for a refused request


def test_model_markup_renders_as_text(page: Any) -> None:
    from selenium.webdriver.common.by import By

    num_answers = len(assistants(page))
    set_field(page, "format", "regex")
    set_field(page, "format-regex", regex_literal(HOSTILE))
    set_field(page, "max_tokens", "200")
    send(page, "Show some markup.")
    node = wait_answer(page, num_answers + 1)
    body = node.find_element(By.CSS_SELECTOR, ".msg-body")
    assert body.get_attribute("textContent").count("window.__xss") == 2
    assert "<script>window.__xss = 1</script>" in body.text
    assert '<img src=x onerror="window.__xss = 2">' in body.text
    assert page.execute_script("return window.__xss") is None
    assert not page.find_elements(By.CSS_SELECTOR, "#messages script, #messages img, "
                                                   "#messages i, #messages b")
    assert body.find_element(By.TAG_NAME, "h1").text == "Title"
    assert body.find_element(By.TAG_NAME, "strong").text == "bold"
    assert body.find_element(By.CSS_SELECTOR, "p > code").text == "<b>inline</b>"
    assert body.find_element(By.CSS_SELECTOR, ".code-block code").text == "<i>verbatim</i>"
    set_field(page, "format", "text")


_RENDER = """
const [cases, done] = arguments;
import("/playground/markdown.js").then((md) => {
  const out = {};
  for (const [name, text] of Object.entries(cases)) {
    const box = document.createElement("div");
    md.renderMarkdown(text, box);
    out[name] = box.innerHTML;
  }
  done(out);
}, (e) => done({error: String(e)}));
"""
MARKDOWN_CASES = {
    "js_link": ("[x](javascript:alert(1))", "<p>[x](javascript:alert(1))</p>"),
    "link": ("[ok](https://example.com)",
             '<p><a href="https://example.com" target="_blank" '
             'rel="noopener noreferrer nofollow">ok</a></p>'),
    "lists": ("- a\n- **b**\n\n3. x\n4. y",
              '<ul><li>a</li><li><strong>b</strong></li></ul><ol start="3"><li>x</li>'
              "<li>y</li></ol>"),
    "table": ("| a | b |\n|---|:-:|\n| 1 | `\\|` |",  # GFM: a pipe in a cell is escaped
              '<div class="table-wrap"><table><thead><tr><th>a</th><th>b</th></tr></thead>'
              "<tbody><tr><td>1</td><td><code>|</code></td></tr></tbody></table></div>"),
    "open_fence": ("```js\nlet a = '<b>';", "let a = '&lt;b&gt;';"),
    "quote": ("> *hi* there", "<blockquote><p><em>hi</em> there</p></blockquote>"),
    "entities": ("&lt;b&gt; & <b>x</b>", "<p>&amp;lt;b&amp;gt; &amp; &lt;b&gt;x&lt;/b&gt;</p>"),
    "snake": ("a_b_c and __init__", "<p>a_b_c and <strong>init</strong></p>"),
}


def test_markdown_renderer_cases(page: Any) -> None:
    got = page.execute_async_script(_RENDER, {k: v[0] for k, v in MARKDOWN_CASES.items()})
    assert "error" not in got, got
    for name, (_, want) in MARKDOWN_CASES.items():
        assert want in got[name], (name, got[name])


def test_screenshots_desktop_and_phone(page: Any) -> None:
    from selenium.webdriver.common.by import By

    # The page holds a stopped story, the bad regex's 400 and the markup answer.
    set_viewport(page, 1280, 860, mobile=False)
    assert screenshot(page, "desktop.png").stat().st_size > 10_000
    set_viewport(page, 375, 740, mobile=True)
    wait_for(page, lambda d: not d.find_element(By.ID, "settings").is_displayed(), 5,
             "the settings are not a closed drawer at 375 px")
    assert page.execute_script("return document.documentElement.scrollWidth") <= 375
    assert page.find_element(By.ID, "settings-toggle").is_displayed()
    screenshot(page, "phone.png")
    page.find_element(By.ID, "settings-toggle").click()
    wait_for(page, lambda d: d.find_element(By.ID, "settings").rect["x"] < 10, 5,
             "the settings drawer did not open")
    screenshot(page, "phone-settings.png")
    page.find_element(By.ID, "settings-close").click()
    page.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


# ---------------------------------------------------------------- vision (fake runtime)


@pytest.fixture(scope="module")
def vision_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    """An in-process server on a fake runtime whose processor is a tiny LLaVA's."""
    import sys

    import uvicorn
    from _fake_runtime import FakeTokenizerManager, fake_starter
    from transformers import AutoTokenizer

    sys.path.insert(0, str(Path(__file__).parents[1] / "multimodal"))
    from _tiny_llava import build_processor_dir

    from radixlm.entrypoints.http.server import create_app
    from radixlm.multimodal.processor import create_mm_processor
    from radixlm.server_args import ServerArgs

    model_dir = build_processor_dir(tmp_path_factory.mktemp("tiny-llava"))
    args = ServerArgs(served_model_name="tiny-llava", model_path=str(model_dir))
    tok = AutoTokenizer.from_pretrained(model_dir)
    tm = FakeTokenizerManager(tok, context_length=4096,
                              mm_processor=create_mm_processor(args, str(model_dir), tok))
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(create_app(args, fake_starter(tm)), host="127.0.0.1",
                                        port=port, log_level="warning",
                                        timeout_graceful_shutdown=1))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    try:
        yield url, tm
    finally:
        srv.should_exit = True
        thread.join(10)


def test_image_upload_for_a_vision_model(driver: Any, vision_server: tuple[str, Any],
                                         tmp_path: Path) -> None:
    from PIL import Image
    from selenium.webdriver.common.by import By

    url, tm = vision_server
    image = tmp_path / "red.png"
    Image.new("RGB", (40, 30), (255, 0, 0)).save(image)
    driver.get(url + "/")
    attach = wait_for(driver, lambda d: d.find_element(By.ID, "attach").is_displayed() and
                      d.find_element(By.ID, "attach"), 30, "no image control for a vision model")
    assert attach.text == "Image"
    driver.find_element(By.ID, "image-input").send_keys(str(image))
    wait_for(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#attachments img"), 10,
             "the image was not attached")
    send(driver, "What colour is this?")
    node = wait_answer(driver, 1)
    assert node.find_element(By.CSS_SELECTOR, ".msg-body").text
    assert driver.find_elements(By.CSS_SELECTOR, "#messages .msg.user img")
    images = tm.received[-1].image_data
    assert isinstance(images, list) and len(images) == 1
    assert images[0].startswith("data:image/png;base64,")
    driver.get("about:blank")  # stop the page's polling before its server goes
