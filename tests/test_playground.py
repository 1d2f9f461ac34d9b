"""kt-serve's playground page (keras_transformer/serving/playground/) in a
real browser: headless Chromium driven by Selenium against `kt-serve`
serving the demo model.

The model is a short `kt-demo` run (tiny config, a few steps) whose export
carries its held-out test sentences as examples. Environment:

    KT_PLAYGROUND_SAVED_MODEL=saved_models/demo   serve this export instead
                                                  (e.g. the full demo model)
    KT_PLAYGROUND_SCREENSHOT=playground.png       where the screenshot goes
                                                  (default: pytest's tmp dir)

What the page shows is checked against the server's own REST answers for
the same request. Skipped, with the reason, where Chromium, chromedriver or
selenium is missing (.ci/run installs the first two where it can).
"""

import math
import os
import shutil

import pytest

from support.demo_run import tiny_demo
from support.serving_model import start_server, stop_server

# Chromium, kt-serve and the demo's run, each in its own process: the
# end-to-end tier (docs/testing.md#tiers).
pytestmark = pytest.mark.e2e

CHROMIUM = "/usr/bin/chromium"
# A request's answer, in the browser; the tiny model's searches take a
# fraction of this.
WAIT_S = 60
# float32 scores and probabilities, through JSON and JavaScript doubles.
RTOL = 1e-5


@pytest.fixture(scope="module")
def chromedriver():
    """The chromedriver path; skips the module when the browser stack is
    missing, before any model is trained."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        pytest.skip("selenium is not installed (pip install -e '.[test]')")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} is absent (Debian: apt-get install chromium chromium-driver)")
    driver = shutil.which("chromedriver")
    if driver is None:
        pytest.skip("chromedriver is not on PATH (Debian: apt-get install chromium-driver)")
    return driver


@pytest.fixture(scope="module")
def model_dir(chromedriver, tmp_path_factory):
    """`saved_models/<name>`: KT_PLAYGROUND_SAVED_MODEL's, else a short
    kt-demo run's export."""
    given = os.environ.get("KT_PLAYGROUND_SAVED_MODEL")
    if given:
        return os.path.abspath(given.rstrip(os.sep))
    # The pytest run's tiny demo run, which tests/test_demo.py checks.
    demo = tiny_demo(tmp_path_factory)
    assert demo["returncode"] == 0, demo["stdout"][-3000:] + demo["stderr"][-3000:]
    return os.path.join(demo["saved_models"], "demo")


@pytest.fixture(scope="module")
def server(model_dir):
    """`(base_url, model name)` of kt-serve serving `model_dir`."""
    name = os.path.basename(model_dir)
    process, url = start_server(["--model-name", name, "--model-base-path", model_dir])
    try:
        yield url, name
    finally:
        stop_server(process)


@pytest.fixture(scope="module")
def info(server):
    import requests

    response = requests.get(server[0] + "/playground/info", timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture(scope="module")
def browser(chromedriver, tmp_path_factory):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tmp_path_factory.mktemp("chromium-profile")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--window-size=1280,900",
                 f"--user-data-dir={profile}"):
        options.add_argument(flag)
    # The console's messages, to find the page's script errors.
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # An explicit driver path: Selenium Manager (which downloads) never runs.
    driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def predict(server, signature, **inputs):
    """The server's REST answer: `(status code, JSON body)`."""
    import requests

    url, name = server
    response = requests.post(f"{url}/v1/models/{name}:predict", timeout=120,
                             json={"signature_name": signature, "inputs": inputs})
    return response.status_code, response.json()


def search_options(info):
    return {"beam_size": info["beam_size"], "alpha": info["alpha"],
            "extra_length": info["extra_length"]}


def open_page(browser, server, info):
    """Loads `/` and waits until it shows the model's information."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(server[0] + "/")
    WebDriverWait(browser, WAIT_S).until(
        lambda d: info["model_name"] in d.find_element(By.ID, "model").text)


def wait_for_results(browser, text):
    """Waits until the page has answered for `text`; returns its state
    ("done", or "error" when a request failed)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def answered(d):
        results = d.find_element(By.ID, "results")
        state = results.get_attribute("data-state")
        if results.get_attribute("data-text") == text and state in ("done", "error"):
            return state
        return False

    return WebDriverWait(browser, WAIT_S).until(answered)


def error_text(browser):
    from selenium.webdriver.common.by import By

    box = browser.find_element(By.ID, "error")
    return box.get_attribute("textContent") if box.is_displayed() else ""


def fit_window_to_page(browser, width=1280):
    """Resizes the window so the whole page fits its viewport (a screenshot
    of all of it)."""
    for _ in range(3):
        missing = browser.execute_script(
            "return document.documentElement.scrollHeight - window.innerHeight")
        if missing <= 0:
            return
        browser.set_window_size(width, browser.get_window_size()["height"] + missing)


def check_results(browser, server, info, text):
    """The page's n-best list, piece probabilities and alignment for `text`
    against the server's answers to the same requests."""
    from selenium.webdriver.common.by import By

    state = wait_for_results(browser, text)
    assert state == "done", error_text(browser)
    assert error_text(browser) == ""
    options = search_options(info)
    beam = info["beam_size"]

    status, reference = predict(server, "translate_with_options", text=[text], **options)
    assert status == 200, reference
    status, nbest = predict(server, "translate_nbest", text=[text], n=beam, **options)
    assert status == 200, nbest
    status, explain = predict(server, "translate_explain", text=[text], **options)
    assert status == 200, explain
    explain = explain["outputs"]

    items = browser.find_elements(By.CSS_SELECTOR, "#nbest .hypothesis")
    assert len(items) == beam
    shown = [i.find_element(By.CLASS_NAME, "translation").get_attribute("textContent")
             for i in items]
    scores = [float(i.find_element(By.CLASS_NAME, "score").get_attribute("data-score"))
              for i in items]
    # The best is what serving_default's search gives with these options.
    assert shown[0] == reference["outputs"]["translation"][0]
    assert math.isclose(scores[0], reference["outputs"]["score"][0], rel_tol=RTOL, abs_tol=0)
    assert shown == nbest["outputs"]["translations"][0]
    for score, expected in zip(scores, nbest["outputs"]["scores"][0]):
        assert math.isclose(score, expected, rel_tol=RTOL)
    assert all(math.isfinite(s) and s <= 0.0 for s in scores)
    assert scores == sorted(scores, reverse=True)

    target_length = explain["target_length"][0]
    source_length = explain["source_length"][0]
    tokens = browser.find_elements(By.CSS_SELECTOR, "#tokens .token")
    assert len(tokens) == target_length
    assert [t.get_attribute("data-piece") for t in tokens] == \
        explain["target_pieces"][0][:target_length]
    for token, log_prob in zip(tokens, explain["token_log_probs"][0]):
        prob = float(token.get_attribute("data-prob"))
        assert 0.0 < prob <= 1.0
        assert math.isclose(prob, math.exp(log_prob), rel_tol=RTOL)
        assert token.get_attribute("title")  # the probability, on hover

    rows = browser.find_elements(By.CSS_SELECTOR, "#alignment tbody tr")
    assert len(rows) == target_length
    cells = browser.find_elements(By.CSS_SELECTOR, "#alignment td.cell")
    assert len(cells) == target_length * source_length
    if target_length:
        labels = browser.find_elements(By.CSS_SELECTOR, "#alignment thead .source-piece .label")
        assert [c.get_attribute("data-piece") for c in labels] == \
            explain["source_pieces"][0][:source_length]
    weights = [float(c.get_attribute("data-weight")) for c in cells]
    expected = [w for row in explain["alignment"][0][:target_length]
                for w in row[:source_length]]
    for weight, want in zip(weights, expected):
        assert math.isclose(weight, want, rel_tol=RTOL, abs_tol=1e-7)
    for i in range(target_length):
        row = weights[i * source_length:(i + 1) * source_length]
        assert math.isclose(sum(row), 1.0, abs_tol=1e-5 * source_length)
    return shown[0], target_length, source_length


def test_playground_translates_an_example(browser, server, info, model_dir, tmp_path_factory):
    from selenium.webdriver.common.by import By

    open_page(browser, server, info)
    version = max(int(v) for v in os.listdir(model_dir) if v.isdigit())
    assert info["model_name"] == os.path.basename(model_dir)
    assert info["version"] == version
    header = browser.find_element(By.ID, "model").text
    assert info["model_name"] in header and str(version) in header
    assert int(browser.find_element(By.ID, "beam-size").get_attribute("value")) == \
        info["beam_size"]
    assert float(browser.find_element(By.ID, "alpha").get_attribute("value")) == \
        pytest.approx(info["alpha"], rel=RTOL)

    examples = browser.find_elements(By.CSS_SELECTOR, "#examples .example")
    assert info["examples"], "the export carries no examples (assets.extra/examples.json)"
    assert [e.get_attribute("textContent") for e in examples] == info["examples"]
    examples[0].click()
    assert browser.find_element(By.ID, "source").get_attribute("value") == info["examples"][0]
    check_results(browser, server, info, info["examples"][0])

    # No script error and no failed request on the way.
    severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert severe == []

    save_screenshot(browser, tmp_path_factory, "screenshot")


def save_screenshot(browser, tmp_path_factory, folder):
    """The whole page as a PNG, at KT_PLAYGROUND_SCREENSHOT or in a pytest
    folder named `folder`."""
    fit_window_to_page(browser)
    path = os.environ.get("KT_PLAYGROUND_SCREENSHOT") or str(
        tmp_path_factory.mktemp(folder) / "playground.png")
    assert browser.save_screenshot(path)
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(path) > 10_000


def test_enter_translates_the_typed_sentence(browser, server, info):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    open_page(browser, server, info)
    text = "the small dog sees a red house"
    box = browser.find_element(By.ID, "source")
    box.send_keys(text + Keys.ENTER)
    check_results(browser, server, info, text)


def test_empty_sentence_gives_empty_translations(browser, server, info):
    from selenium.webdriver.common.by import By

    open_page(browser, server, info)
    browser.find_element(By.ID, "source").clear()
    browser.find_element(By.ID, "translate").click()
    best, target_length, _ = check_results(browser, server, info, "")
    assert best == "" and target_length == 0
    first = browser.find_element(By.CSS_SELECTOR, "#nbest .hypothesis .translation")
    assert "empty" in first.get_attribute("class").split()
    assert first.is_displayed()  # labelled, not a blank line


def test_errors_are_shown(browser, server, info):
    from selenium.webdriver.common.by import By

    open_page(browser, server, info)
    source = browser.find_element(By.ID, "source")
    source.send_keys("the cat")
    beam = browser.find_element(By.ID, "beam-size")
    beam.clear()
    beam.send_keys("9")
    browser.find_element(By.ID, "translate").click()
    assert "Beam size must be a whole number from 1 to 8" in error_text(browser)
    # Refused before any request: the results never started.
    assert browser.find_element(By.ID, "results").get_attribute("data-state") == "idle"

    beam.clear()
    beam.send_keys("2")
    # A model the server does not serve: its 4xx message reaches the page.
    browser.execute_script("window.ktPlayground.state.modelName = 'no-such-model';")
    browser.find_element(By.ID, "translate").click()
    assert wait_for_results(browser, "the cat") == "error"
    status, body = predict((server[0], "no-such-model"), "translate_nbest", text=["the cat"],
                           n=2, beam_size=2, alpha=info["alpha"],
                           extra_length=info["extra_length"])
    assert 400 <= status < 500 and body["error"]
    assert body["error"] in error_text(browser)
    assert browser.find_elements(By.CSS_SELECTOR, "#nbest .hypothesis") == []


def test_the_playground_works_on_a_ctranslate2_export(browser, tmp_path_factory):
    """kt-serve on a CTranslate2 export: the page shows the n-best list and
    scores and says the alignment view is absent, without an error."""
    import requests
    from selenium.webdriver.common.by import By

    pytest.importorskip("ctranslate2")
    from support.serving_model import export_tiny_ctranslate2

    base = tmp_path_factory.mktemp("ct2-playground")
    path = export_tiny_ctranslate2(base, name="tiny", examples=["the dog sees a cat"])
    process, url = start_server(["--model-name", "tiny", "--model-base-path",
                                 os.path.dirname(path)])
    try:
        info = requests.get(url + "/playground/info", timeout=30).json()
        assert info["engine"] == "ctranslate2"
        browser.get_log("browser")  # drop the earlier tests' entries
        open_page(browser, (url, "tiny"), info)
        assert "CTranslate2" in browser.find_element(By.ID, "model").text
        browser.find_elements(By.CSS_SELECTOR, "#examples .example")[0].click()
        state = wait_for_results(browser, "the dog sees a cat")
        assert state == "done", error_text(browser)
        assert error_text(browser) == ""
        items = browser.find_elements(By.CSS_SELECTOR, "#nbest .hypothesis")
        assert len(items) == info["beam_size"]
        answer = requests.post(f"{url}/v1/models/tiny:predict", timeout=60, json={
            "signature_name": "translate_nbest",
            "inputs": {"text": ["the dog sees a cat"], "n": info["beam_size"],
                       "beam_size": info["beam_size"], "alpha": info["alpha"],
                       "extra_length": info["extra_length"]}}).json()["outputs"]
        scores = [float(i.find_element(By.CLASS_NAME, "score").get_attribute("data-score"))
                  for i in items]
        assert scores == pytest.approx(answer["scores"][0], rel=RTOL)
        severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        assert severe == []
    finally:
        stop_server(process)


def test_the_shipped_model_translates_a_typed_caption_into_german(browser, tmp_path_factory):
    """kt-serve on saved_models/multi30k_en_de, as the README's "Try a
    trained model" starts it: a typed English caption comes back in German
    (the words a German caption of it is made of); the README's picture is
    this page (KT_PLAYGROUND_SCREENSHOT)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from test_shipped_model import assert_german

    from support.processes import ROOT

    process, url = start_server(["--model-name", "en_de", "--model-base-path",
                                 os.path.join(ROOT, "saved_models", "multi30k_en_de")])
    try:
        import requests

        info = requests.get(url + "/playground/info", timeout=30).json()
        server = (url, "en_de")
        open_page(browser, server, info)
        text = "A man is riding a bicycle down the street."
        box = browser.find_element(By.ID, "source")
        box.clear()
        box.send_keys(text + Keys.ENTER)
        best, _, _ = check_results(browser, server, info, text)
        assert_german([best])
        severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        assert severe == []
        save_screenshot(browser, tmp_path_factory, "shipped-screenshot")
    finally:
        stop_server(process)
