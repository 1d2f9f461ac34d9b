// The kt-serve playground: translates a sentence through the server's
// TF Serving REST API and shows the n-best list, each target piece's
// probability and the cross-attention alignment.
//
// Requests (JSON, TF Serving's columnar "inputs" format):
//   GET  /playground/info                    model name, version, decoding defaults, examples
//   POST /v1/models/NAME:predict  translate_nbest    {text, n, beam_size, alpha, extra_length}
//   POST /v1/models/NAME:predict  translate_explain  {text, beam_size, alpha, extra_length}
//
// Elements the page fills (and tests query):
//   #nbest     one li.hypothesis per hypothesis, best first: .translation, .score[data-score]
//   #tokens    one .token[data-prob] per target piece of the best translation
//   #alignment a table, one tr per target piece, one td.cell[data-weight] per source piece
//   #error     the last error, readable; hidden when there is none
//   #results   data-state: idle | loading | done | error (a signature failed),
//              data-text: the sentence the shown results belong to
"use strict";

(function () {
  const MAX_BEAM_SIZE = 8;
  const SPACE = "\u2581";  // SentencePiece's word-boundary marker
  const EOS = "</s>";

  // window.ktPlayground exposes this for the browser console.
  const state = {
    modelName: null,
    version: null,
    engine: "savedmodel",
    extraLength: null,
    sequence: 0,  // the newest request's number; older answers are dropped
    ready: null,  // a promise: the info request
  };

  const $ = (id) => document.getElementById(id);

  function element(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  class PlaygroundError extends Error {}

  // --- Requests ------------------------------------------------------------

  async function readJson(response) {
    try {
      return await response.json();
    } catch (_) {
      return null;
    }
  }

  // The body's "error" (TF Serving's 4xx/5xx shape), else the HTTP status.
  function failure(response, body) {
    const detail = body && typeof body.error === "string" ? body.error
      : `${response.status} ${response.statusText}`.trim();
    return new PlaygroundError(detail);
  }

  async function getInfo() {
    let response;
    try {
      response = await fetch("/playground/info", { headers: { Accept: "application/json" } });
    } catch (err) {
      throw new PlaygroundError(`could not reach the server (${err.message})`);
    }
    const body = await readJson(response);
    if (!response.ok) throw failure(response, body);
    if (!body || typeof body.model_name !== "string") {
      throw new PlaygroundError("the answer has no model_name");
    }
    return body;
  }

  // Runs `signature` on `inputs` (columnar, one sentence) and returns the
  // answer's "outputs" object; PlaygroundError with the server's message on
  // a non-2xx status or an unreachable server.
  async function predict(signature, inputs) {
    const url = `/v1/models/${encodeURIComponent(state.modelName)}:predict`;
    let response;
    try {
      response = await fetch(url, {
        method: "POST",
        headers: { "Content-Type": "application/json", Accept: "application/json" },
        body: JSON.stringify({ signature_name: signature, inputs: inputs }),
      });
    } catch (err) {
      throw new PlaygroundError(`could not reach the server (${err.message})`);
    }
    const body = await readJson(response);
    if (!response.ok) throw failure(response, body);
    if (!body || typeof body.outputs !== "object" || body.outputs === null) {
      throw new PlaygroundError("the answer has no \"outputs\" object");
    }
    return body.outputs;
  }

  // --- Input ---------------------------------------------------------------

  function readOptions() {
    const beamText = $("beam-size").value.trim();
    const beamSize = Number(beamText);
    if (!/^\d+$/.test(beamText) || beamSize < 1 || beamSize > MAX_BEAM_SIZE) {
      throw new PlaygroundError(
        `Beam size must be a whole number from 1 to ${MAX_BEAM_SIZE}` +
        (beamText ? `, not "${beamText}".` : "."));
    }
    const alphaText = $("alpha").value.trim();
    const alpha = Number(alphaText);
    if (alphaText === "" || !Number.isFinite(alpha) || alpha < 0) {
      throw new PlaygroundError(
        "The length penalty \u03b1 must be a number >= 0" +
        (alphaText ? `, not "${alphaText}".` : "."));
    }
    return { beamSize: beamSize, alpha: alpha };
  }

  // --- Output --------------------------------------------------------------

  function showError(message) {
    const box = $("error");
    box.textContent = message;
    box.hidden = false;
  }

  function clearError() {
    const box = $("error");
    box.textContent = "";
    box.hidden = true;
  }

  function clearResults() {
    $("nbest").replaceChildren();
    $("tokens").replaceChildren();
    $("alignment").replaceChildren();
    $("status").textContent = "";
  }

  // A piece with each SentencePiece space marker shown as a muted "▁".
  function pieceNode(piece, className) {
    const node = element("span", className);
    node.dataset.piece = piece;
    if (piece === EOS) {
      node.classList.add("eos");
      node.textContent = piece;
      return node;
    }
    piece.split(SPACE).forEach((part, index) => {
      if (index > 0) node.appendChild(element("span", "space", SPACE));
      if (part) node.appendChild(document.createTextNode(part));
    });
    return node;
  }

  // A background of the accent colour at opacity `amount` in [0, 1], with
  // the text colour that stays readable on it.
  function shade(node, amount) {
    const a = Math.min(1, Math.max(0, amount));
    node.style.backgroundColor = `rgba(37, 99, 235, ${a.toFixed(3)})`;
    node.classList.toggle("on-dark", a > 0.55);
  }

  function renderNbest(outputs) {
    const translations = (outputs.translations || [])[0] || [];
    const scores = (outputs.scores || [])[0] || [];
    const list = $("nbest");
    list.replaceChildren();
    translations.forEach((translation, i) => {
      const item = element("li", i === 0 ? "hypothesis best" : "hypothesis");
      const words = element("span", "translation", translation);
      // An empty sentence translates to the empty string; CSS labels it.
      if (translation === "") words.classList.add("empty");
      const score = element("span", "score", Number(scores[i]).toFixed(4));
      score.dataset.score = String(scores[i]);
      score.title = `score ${scores[i]} (log-probability / length penalty)`;
      item.append(words, score);
      list.appendChild(item);
    });
    if (translations.length === 0) {
      list.appendChild(element("li", "muted", "no hypotheses"));
    }
    return translations.length;
  }

  function renderExplain(outputs) {
    const targetLength = Number(outputs.target_length[0]);
    const sourceLength = Number(outputs.source_length[0]);
    const targetPieces = outputs.target_pieces[0].slice(0, targetLength);
    const sourcePieces = outputs.source_pieces[0].slice(0, sourceLength);
    const logProbs = outputs.token_log_probs[0];
    const weights = outputs.alignment[0];

    const tokens = $("tokens");
    tokens.replaceChildren();
    targetPieces.forEach((piece, i) => {
      const p = Math.exp(Number(logProbs[i]));
      const token = pieceNode(piece, "token");
      token.dataset.prob = String(p);
      token.dataset.row = String(i);
      token.title = `p = ${p.toFixed(4)} (log p = ${Number(logProbs[i]).toFixed(4)})`;
      shade(token, p);
      tokens.appendChild(token);
    });
    if (targetPieces.length === 0) {
      tokens.appendChild(element("span", "muted", "no target pieces"));
    }

    const table = $("alignment");
    table.replaceChildren();
    if (targetLength === 0 || sourceLength === 0) return;
    const head = element("thead");
    const headRow = element("tr");
    headRow.appendChild(element("th", "corner"));
    sourcePieces.forEach((piece) => {
      const th = element("th", "source-piece");
      th.scope = "col";
      th.appendChild(pieceNode(piece, "label"));
      headRow.appendChild(th);
    });
    head.appendChild(headRow);
    const body = element("tbody");
    targetPieces.forEach((target, i) => {
      const row = element("tr");
      row.dataset.row = String(i);
      const th = element("th", "target-piece");
      th.scope = "row";
      th.appendChild(pieceNode(target, "label"));
      row.appendChild(th);
      sourcePieces.forEach((source, j) => {
        const w = Number(weights[i][j]);
        const cell = element("td", "cell");
        cell.dataset.weight = String(w);
        cell.title = `${target} \u2192 ${source}: ${w.toFixed(3)}`;
        shade(cell, w);
        row.appendChild(cell);
      });
      body.appendChild(row);
    });
    table.append(head, body);
  }

  // Hovering a piece of the best translation highlights its alignment row.
  function highlightRow(event) {
    const token = event.target.closest(".token");
    const on = event.type === "mouseover" && token;
    document.querySelectorAll("#alignment tr.highlight")
      .forEach((row) => row.classList.remove("highlight"));
    if (on) {
      const row = document.querySelector(`#alignment tr[data-row="${token.dataset.row}"]`);
      if (row) row.classList.add("highlight");
    }
  }

  // --- Translating ---------------------------------------------------------

  async function translate() {
    clearError();
    let options;
    try {
      options = readOptions();
    } catch (err) {
      showError(err.message);
      return;
    }
    const results = $("results");
    const text = $("source").value;
    const sequence = ++state.sequence;
    results.dataset.state = "loading";
    results.dataset.text = text;
    $("status").textContent = "Translating\u2026";
    try {
      await state.ready;
    } catch (err) {
      results.dataset.state = "error";
      $("status").textContent = "";
      showError(`Model information is missing: ${err.message}`);
      return;
    }
    const common = {
      text: [text],
      beam_size: options.beamSize,
      alpha: options.alpha,
      extra_length: state.extraLength,
    };
    const started = performance.now();
    // An engine without translate_explain (CTranslate2) gets the n-best
    // list and scores only.
    const explains = state.engine !== "ctranslate2";
    const [nbest, explain] = await Promise.allSettled([
      predict("translate_nbest", Object.assign({ n: options.beamSize }, common)),
      explains ? predict("translate_explain", common) : Promise.resolve(null),
    ]);
    if (sequence !== state.sequence) return;  // a newer request owns the page
    const milliseconds = Math.round(performance.now() - started);
    clearResults();
    const problems = [];
    let count = 0;
    if (nbest.status === "fulfilled") {
      count = renderNbest(nbest.value);
    } else {
      problems.push(`translate_nbest failed: ${nbest.reason.message}`);
    }
    if (!explains) {
      $("status").dataset.engine = "ctranslate2";
    } else if (explain.status === "fulfilled") {
      try {
        renderExplain(explain.value);
      } catch (err) {
        problems.push(`translate_explain gave an answer the page cannot read: ${err.message}`);
      }
    } else {
      problems.push("translate_explain failed (the piece probabilities and the alignment " +
                    `need it): ${explain.reason.message}`);
    }
    if (problems.length) showError(problems.join("\n"));
    results.dataset.state = problems.length ? "error" : "done";
    $("status").textContent = nbest.status === "fulfilled"
      ? `${count} hypotheses \u00b7 beam ${options.beamSize}, \u03b1 ${options.alpha}, ` +
        `extra length ${state.extraLength} \u00b7 ${milliseconds} ms`
      : "";
  }

  // --- Start-up ------------------------------------------------------------

  function showInfo(info) {
    state.modelName = info.model_name;
    state.version = info.version;
    state.engine = info.engine || "savedmodel";
    state.extraLength = Number(info.extra_length);
    $("model").textContent = `${info.model_name} \u00b7 version ${info.version}` +
      (state.engine === "ctranslate2"
        ? " \u00b7 CTranslate2 (no alignment view: its attention is one head's)" : "");
    $("endpoint").textContent = `/v1/models/${info.model_name}:predict`;
    const beam = Math.min(MAX_BEAM_SIZE, Math.max(1, Number(info.beam_size) || 1));
    $("beam-size").value = String(beam);
    $("alpha").value = String(info.alpha);
    const examples = $("examples");
    examples.replaceChildren();
    (info.examples || []).forEach((sentence) => {
      const button = element("button", "example", sentence);
      button.type = "button";
      button.title = "Translate this sentence";
      button.addEventListener("click", () => {
        $("source").value = sentence;
        translate();
      });
      examples.appendChild(button);
    });
    if (!examples.children.length) {
      examples.appendChild(element("span", "muted", "this export carries no examples"));
    }
  }

  function start() {
    state.ready = getInfo().then(showInfo);
    state.ready.catch((err) => {
      $("model").textContent = "model information unavailable";
      showError(`Could not load /playground/info: ${err.message}`);
    });
    $("translate-form").addEventListener("submit", (event) => {
      event.preventDefault();
      translate();
    });
    $("tokens").addEventListener("mouseover", highlightRow);
    $("tokens").addEventListener("mouseout", highlightRow);
    $("source").focus();
  }

  window.ktPlayground = { state: state, predict: predict, translate: translate };
  document.addEventListener("DOMContentLoaded", start);
})();
