// examforge's page: plain JavaScript, no build step, no library (there is nothing to fetch
// from a CDN where examforge runs, and the page needs little: fetch, an SSE reader, a table).
//
// What it must never do is start a paid run twice or lose one:
// - start makes ONE Idempotency-Key per click (crypto.randomUUID) and reuses it for the
//   retries of that click, so a retried request returns the same run; the button is disabled
//   while the request is in flight and while the exam has a live run, so a double click is one
//   request;
// - the runs it follows are kept in the URL (#run=ID) and in localStorage (run ids are not
//   secrets), so a closed and reopened tab finds its run again; closing the tab cancels nothing
//   (only the cancel button does).
"use strict";

const TOKEN_KEY = "examforge.token";
const RUNS_KEY = "examforge.runs"; // {exam slug: run id}
const FINAL = new Set(["done", "failed", "cancelled"]);
const LIVE = new Set(["queued", "running"]);
const PAGE_SIZE = 50;
// Exams per page of the list: each card then reads its exam's status and runs.
const EXAM_PAGE_SIZE = 20;

const $ = (sel, root = document) => root.querySelector(sel);
const state = {
  exams: new Map(), // slug -> {card, exam, run, stream, starting}
  questions: { exam: null, after: null, count: 0 },
  examsNext: null, // the cursor of the next page of exams (GET /exams `next`), or null
};

// ---- a question's language ---------------------------------------------------------------
//
// Every question, choice and explanation element says the language it is written in (`lang`:
// the question's `language`, its chapter's BCP 47 tag) and its direction: `dir="auto"`, so the
// browser takes it from the first strong character, except in a language written right to
// left (Persian, Arabic), where it is `rtl`. `auto` alone reads a Persian sentence that starts
// with a Latin term ("DNS روی درگاه ۵۳ ...") left to right: its first strong character is
// Latin. Either way the Latin terms stay in place. A choice's letter is an element of its own
// with `dir="ltr"`, which `dir="auto"` skips: the choice's direction is its text's.

// Scripts written right to left, by language, where the browser's Intl.Locale cannot say.
const RTL_LANGUAGES = new Set(["ar", "fa", "he", "ur", "ps", "sd", "ug", "yi", "dv", "ckb"]);

function langDir(lang) {
  try {
    const locale = new Intl.Locale(lang || "en");
    const info = typeof locale.getTextInfo === "function" ? locale.getTextInfo() : locale.textInfo;
    if (info && info.direction) return info.direction === "rtl" ? "rtl" : "auto";
  } catch (err) {
    // not a tag this browser can read: by its primary subtag below
  }
  return RTL_LANGUAGES.has(String(lang || "").split("-")[0].toLowerCase()) ? "rtl" : "auto";
}

function inLanguage(el, lang) {
  el.lang = lang || "en";
  el.dir = langDir(el.lang);
  return el;
}

// A choice as a list item: its letter (and the key's mark), then its text.
function choiceItem(choice, i, correct, lang) {
  const li = inLanguage(document.createElement("li"), lang);
  const letter = document.createElement("span");
  letter.className = "letter";
  letter.dir = "ltr";
  letter.textContent = `${correct ? "✓ " : ""}${String.fromCharCode(65 + i)}.`;
  li.append(letter, ` ${choice}`);
  return li;
}

// ---- token ----------------------------------------------------------------------------

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

function askToken(message = "") {
  sessionStorage.removeItem(TOKEN_KEY);
  for (const entry of state.exams.values()) stopStream(entry);
  $("#app").hidden = true;
  $("#who").hidden = true;
  me = null;
  applyRole();
  $("#login").hidden = false;
  $("#login-error").textContent = message;
  $("#token").focus();
}

class AuthError extends Error {}

class ApiError extends Error {
  constructor(status, problem) {
    super((problem && (problem.detail || problem.title)) || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

// Every call carries the Bearer token. Errors are RFC 9457 problem documents: their detail is
// what the page shows.
async function api(path, { method = "GET", body, headers = {} } = {}) {
  const init = { method, headers: { Authorization: `Bearer ${token()}`, ...headers } };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const resp = await fetch(path, init);
  if (resp.status === 401) throw new AuthError("the token was refused");
  const type = resp.headers.get("Content-Type") || "";
  const data = type.includes("json") ? await resp.json() : null;
  if (!resp.ok) throw new ApiError(resp.status, data);
  return { data, resp };
}

function notice(err) {
  if (err instanceof AuthError) return askToken("That token was refused (401): enter a valid one.");
  $("#notice").textContent = err ? `${err.message}` : "";
}

// ---- who the token is: its role decides what the page offers --------------------------
//
// Each role includes the ones before it. Until GET /me answers, the page offers nothing
// beyond reading: a control shown to a role that may not use it would only end in a 403.

const ROLES = ["reader", "reviewer", "operator", "admin"];
let me = null; // GET /me's answer: {name, role, exams}

// Whether a caller of `role` may do what `needed` may (both of ROLES).
function allows(role, needed) {
  const rank = ROLES.indexOf(role);
  return rank >= 0 && rank >= ROLES.indexOf(needed);
}

function can(needed) {
  return Boolean(me) && allows(me.role, needed);
}

// The page's controls carry data-needs="ROLE"; the body's classes hide those the role lacks.
function applyRole() {
  document.body.classList.toggle("can-review", can("reviewer"));
  document.body.classList.toggle("can-operate", can("operator"));
  $("#me-name").textContent = me ? me.name : "";
  $("#me-role").textContent = me ? me.role : "";
  $("#me-role").dataset.role = me ? me.role : "";
}

async function loadMe() {
  try {
    me = (await api("/me")).data;
  } catch (err) {
    me = null;
    if (err instanceof AuthError) throw err;
    notice(new Error(`who this token is could not be read (${err.message}): the page only reads`));
  }
  applyRole();
}

// ---- the runs the page follows, kept across a closed tab ------------------------------

function savedRuns() {
  try {
    return JSON.parse(localStorage.getItem(RUNS_KEY) || "{}");
  } catch {
    return {};
  }
}

function rememberRun(exam, runId) {
  const runs = savedRuns();
  runs[exam] = runId;
  localStorage.setItem(RUNS_KEY, JSON.stringify(runs));
  const hash = new URLSearchParams(location.hash.slice(1));
  hash.set("run", runId);
  history.replaceState(null, "", `#${hash}`);
}

// The run id the URL names (a reopened tab keeps its URL), for the exam it belongs to.
function urlRun() {
  return new URLSearchParams(location.hash.slice(1)).get("run");
}

// ---- shapes: tolerant readers of the API's JSON ---------------------------------------

const slugOf = (e) => e.slug ?? e.exam ?? e.name;
const num = (x) => (typeof x === "number" && isFinite(x) ? x : null);

function progressOf(obj) {
  // A run or a progress event: {"questions": {"done", "target"}} or {"done", "target"}.
  const q = obj && typeof obj.questions === "object" && obj.questions ? obj.questions : obj || {};
  return { done: num(q.done) ?? 0, target: num(q.target) ?? 0 };
}

function runIdOf(exam) {
  // An exam's status may name its latest run (any of these spellings).
  const r = exam.latest_run ?? exam.run ?? exam.last_run;
  if (r && typeof r === "object") return r.id ?? null;
  return r ?? exam.latest_run_id ?? exam.run_id ?? null;
}

// ---- rendering ------------------------------------------------------------------------

function card(slug) {
  let entry = state.exams.get(slug);
  if (entry) return entry;
  const node = $("#exam-card").content.firstElementChild.cloneNode(true);
  node.dataset.exam = slug;
  $(".slug", node).textContent = slug;
  entry = { card: node, exam: {}, run: null, stream: null, starting: false };
  // Resume is a new run of the same exam: it generates only what is still missing.
  $(".start", node).addEventListener("click", () => start(entry));
  $(".resume", node).addEventListener("click", () => start(entry));
  $(".cancel", node).addEventListener("click", () => cancel(entry));
  $(".show-questions", node).addEventListener("click", () => showQuestions(slug));
  $(".show-review", node).addEventListener("click", () => showReview(slug));
  state.exams.set(slug, entry);
  $("#exams").append(node);
  return entry;
}

function render(entry) {
  const { card: node, exam, run } = entry;
  const source = run || exam;
  const { done, target } = progressOf(source);
  const runState = run ? run.state : exam.state;
  $(".title", node).textContent = exam.title || slugOf(exam) || "";
  const badge = $(".state", node);
  badge.textContent = runState || "new";
  badge.dataset.state = runState || "";
  const bar = $(".bar", node);
  const pct = target ? Math.min(100, (100 * done) / target) : 0;
  $(".fill", bar).style.width = `${pct}%`;
  bar.dataset.done = done;
  bar.dataset.target = target;
  bar.setAttribute("aria-valuenow", String(done));
  bar.setAttribute("aria-valuemax", String(target));
  $(".done", node).textContent = done;
  $(".target", node).textContent = target;
  // The budget is the exam's (it spans its runs): the run's own cost, and the exam's spend
  // against the budget.
  const cost = num(source.cost_usd) ?? 0;
  const spent = num(run?.spent_usd) ?? num(exam.spent_usd) ?? cost;
  const budget = num(run?.budget_usd) ?? num(exam.budget_usd);
  $(".cost", node).textContent = `$${cost.toFixed(4)}${run ? " this run" : ""}`;
  $(".budget", node).textContent = budget === null ? "· no budget"
    : `· $${spent.toFixed(4)} spent of $${budget.toFixed(4)} budget`;
  $(".budget", node).classList.toggle("over", budget !== null && spent >= budget);
  const meter = $(".budget-bar", node);
  meter.hidden = budget === null;
  if (budget !== null) $(".fill", meter).style.width = `${Math.min(100, (100 * spent) / budget)}%`;
  $(".run", node).textContent = run ? `· run ${run.id}` : "";
  // The exam's blind-solve policy, which every worker follows (off, flag, replace).
  const policy = exam.verify ?? null;
  $(".verify", node).textContent = policy ? `· blind solves: ${policy}` : "";
  $(".verify", node).dataset.verify = policy ?? "";
  $(".run", node).dataset.run = run ? run.id : "";
  const reason = run?.pause_reason ?? (runState === "paused" ? exam.pause_reason : null);
  const code = run?.pause_reason ? run.pause_code : (runState === "paused" ? exam.pause_code : null);
  // What ends the pause depends on its code, never on the reason's text.
  const hint = code === "budget" ? " (a new run with a higher budget resumes it)" : "";
  $(".reason", node).textContent = reason ? `paused: ${reason}${hint}` : "";
  // Batch mode: what the run waits on (a provider batch can take hours: not stuck), and
  // its batches.
  const detail = LIVE.has(runState) || runState === "paused" ? run?.state_detail : null;
  $(".detail", node).textContent = detail || "";
  $(".detail", node).hidden = !detail;
  renderBatches(node, run ? run.batches : exam.batches);
  const live = LIVE.has(runState);
  $(".start", node).disabled = entry.starting || live;
  $(".cancel", node).disabled = entry.starting || !run || !(live || runState === "paused");
  $(".resume", node).disabled = entry.starting || !(runState === "paused" || runState === "cancelled" || runState === "failed");
}

function renderBatches(node, batches) {
  const table = $(".batches", node);
  const list = Array.isArray(batches) ? batches : [];
  table.hidden = list.length === 0;
  const rows = list.map((b) => {
    const tr = document.createElement("tr");
    tr.dataset.batch = b.id ?? b.submission ?? "";
    tr.dataset.status = b.status ?? "";
    const r = b.requests || {};
    const counts = `${r.completed ?? 0}/${r.total ?? 0} done` + (r.failed ? `, ${r.failed} failed` : "");
    const status = (b.status ?? b.state ?? "") + (b.cancel_requested && b.live ? " (cancel requested)" : "");
    for (const text of [b.id ?? `(submission ${b.submission})`, status, counts,
                        b.created_at ?? "", b.expires_at ?? ""]) {
      const td = document.createElement("td");
      td.textContent = String(text);
      tr.append(td);
    }
    return tr;
  });
  $("tbody", table).replaceChildren(...rows);
}

// A run that waits on a provider batch gets no progress event for a long time: its batches
// are read again every BATCH_REFRESH_MS while it is live.
const BATCH_REFRESH_MS = 5000;

async function refreshBatchRuns() {
  for (const entry of state.exams.values()) {
    const run = entry.run;
    if (!run || !LIVE.has(run.state) || !(run.batch || (run.batches || []).length)) continue;
    try {
      const { data } = await api(`/runs/${encodeURIComponent(run.id)}`);
      // Unless another run took the card meanwhile, or the stream moved it on.
      if (!entry.run || entry.run.id !== run.id || FINAL.has(entry.run.state)) continue;
      entry.run = { ...entry.run, ...data };
      render(entry);
    } catch (err) {
      if (err instanceof AuthError) return notice(err);
    }
  }
}

// ---- exams ----------------------------------------------------------------------------

// The first page of exams (refresh), or with `more` the page after the last one shown:
// keyset pages, newest first, so an exam recorded meanwhile never shifts the later pages.
async function loadExams(more = false) {
  notice(null);
  try {
    const params = new URLSearchParams({ limit: String(EXAM_PAGE_SIZE) });
    if (more === true && state.examsNext) params.set("after", state.examsNext);
    const { data } = await api(`/exams?${params}`);
    const list = Array.isArray(data) ? data : data.exams ?? data.items ?? [];
    state.examsNext = Array.isArray(data) ? null : data.next ?? null;
    $("#exams-more").hidden = !state.examsNext;
    if (more !== true) $("#empty").hidden = list.length > 0;
    const saved = savedRuns();
    const fromUrl = urlRun();
    await Promise.all(list.map(async (summary) => {
      const slug = slugOf(summary);
      const entry = card(slug);
      entry.exam = { ...summary };
      try {
        entry.exam = { ...summary, ...(await api(`/exams/${encodeURIComponent(slug)}`)).data };
      } catch (err) {
        if (err instanceof AuthError) throw err;
      }
      render(entry);
      // The exam's latest run from the API (any tab, any replica started it), else the run
      // this browser last followed.
      const candidates = [await latestRun(slug), runIdOf(entry.exam), fromUrl, saved[slug]]
        .filter((id) => id !== null && id !== undefined);
      for (const id of new Set(candidates)) {
        if (await follow(entry, id)) break;
      }
    }));
  } catch (err) {
    notice(err);
  }
}

async function latestRun(slug) {
  try {
    const { data } = await api(`/exams/${encodeURIComponent(slug)}/runs`);
    const items = Array.isArray(data) ? data : data.items ?? [];
    return items.length ? items[0].id : null; // newest first
  } catch (err) {
    if (err instanceof AuthError) throw err;
    return null;
  }
}

// Show a run and stream its progress; false if it is not a run of this exam.
async function follow(entry, runId) {
  let run;
  try {
    run = (await api(`/runs/${encodeURIComponent(runId)}`)).data;
  } catch (err) {
    if (err instanceof AuthError) throw err;
    return false;
  }
  const slug = entry.card.dataset.exam;
  if (run.exam !== undefined && run.exam !== slug) return false;
  if (entry.run && entry.run.id !== run.id && newer(entry.run, run)) return true;
  entry.run = run;
  rememberRun(slug, run.id);
  render(entry);
  if (!FINAL.has(run.state)) openStream(entry);
  return true;
}

function newer(a, b) {
  return (a.created_at || "") > (b.created_at || "");
}

// ---- start, resume, cancel ------------------------------------------------------------

async function start(entry) {
  if (entry.starting || !can("operator")) return;
  entry.starting = true; // disables the buttons until the run is known
  render(entry);
  const slug = entry.card.dataset.exam;
  const raw = $(".budget-input", entry.card).value.trim();
  const body = raw === "" ? {} : { budget_usd: Number(raw) };
  if ($(".batch-input", entry.card).checked) body.batch = true;
  // One key per click: a retry of this click (a network error, a 5xx) sends the same key and
  // gets the same run back, never a second one.
  const key = crypto.randomUUID();
  try {
    let run = null;
    for (let attempt = 0; attempt < 4 && !run; attempt++) {
      try {
        const { data } = await api(`/exams/${encodeURIComponent(slug)}/runs`, {
          method: "POST",
          body,
          headers: { "Idempotency-Key": key },
        });
        run = data;
      } catch (err) {
        const transient = err instanceof TypeError || (err instanceof ApiError && err.status >= 500);
        if (!transient || attempt === 3) throw err;
        await sleep(500 * 2 ** attempt);
      }
    }
    stopStream(entry);
    entry.run = run;
    rememberRun(slug, run.id);
    notice(null);
    openStream(entry);
  } catch (err) {
    notice(err);
  } finally {
    entry.starting = false;
    render(entry);
  }
}

async function cancel(entry) {
  if (!entry.run || !can("operator")) return;
  try {
    const runId = entry.run.id;
    const { data } = await api(`/runs/${encodeURIComponent(runId)}/cancel`, { method: "POST" });
    if (data && data.id && entry.run && entry.run.id === runId) entry.run = data;
    await refreshRun(entry, runId);
  } catch (err) {
    notice(err);
  }
}

// Re-read run `runId` and show it, unless another run took the card meanwhile: a refresh of
// a cancelled run still on its way when "resume" started a new one must not put the old run
// back on the card (its stream would then be the only one the card listens to).
async function refreshRun(entry, runId = entry.run && entry.run.id) {
  if (runId === undefined || runId === null) return;
  let run;
  try {
    run = (await api(`/runs/${encodeURIComponent(runId)}`)).data;
  } catch (err) {
    return notice(err);
  }
  if (!entry.run || entry.run.id !== runId) return;
  entry.run = run;
  render(entry);
  if (state.questions.exam === entry.card.dataset.exam) reloadQuestions();
}

// ---- the event stream -----------------------------------------------------------------
//
// Written by hand because EventSource cannot send an Authorization header and the API takes
// the token only there (a token in the URL would end up in logs). The reader follows the
// WHATWG event-stream format: fields, comments (the heartbeats), multi-line data, `retry`;
// on a cut it reconnects with Last-Event-ID, so no event is missed.

function stopStream(entry) {
  if (entry.stream) entry.stream.abort();
  entry.stream = null;
}

function openStream(entry) {
  stopStream(entry);
  const controller = new AbortController();
  entry.stream = controller;
  streamRun(entry, entry.run.id, controller.signal).catch((err) => {
    if (!controller.signal.aborted) notice(err);
  });
}

async function streamRun(entry, runId, signal) {
  let lastId = null;
  let retryMs = 1000;
  while (!signal.aborted) {
    let final = false;
    try {
      const headers = { Authorization: `Bearer ${token()}`, Accept: "text/event-stream" };
      if (lastId !== null) headers["Last-Event-ID"] = lastId;
      const resp = await fetch(`/runs/${encodeURIComponent(runId)}/events`, { headers, signal, cache: "no-store" });
      if (resp.status === 401) throw new AuthError("the token was refused");
      if (!resp.ok) throw new ApiError(resp.status, await resp.json().catch(() => null));
      // 204: the final event was received already (on an earlier connection).
      final = resp.status === 204;
      if (!final) for await (const ev of sseEvents(resp.body, signal)) {
        if (ev.id !== null) lastId = ev.id;
        if (ev.retry !== null) retryMs = ev.retry;
        onEvent(entry, runId, ev);
        if (FINAL.has(ev.type)) final = true;
      }
    } catch (err) {
      if (signal.aborted) return;
      if (err instanceof AuthError || (err instanceof ApiError && err.status < 500)) throw err;
    }
    if (final) {
      await refreshRun(entry, runId);
      return;
    }
    await sleep(retryMs);
  }
}

async function* sseEvents(body, signal) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let ev = blankEvent();
  try {
    while (!signal.aborted) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      const lines = buffer.split(/\r\n|\r|\n/);
      buffer = lines.pop(); // an incomplete line waits for the next chunk
      for (const line of lines) {
        if (line === "") {
          if (ev.data.length) yield { ...ev, data: ev.data.join("\n") };
          ev = blankEvent();
          continue;
        }
        if (line.startsWith(":")) continue; // a comment: the heartbeat
        const at = line.indexOf(":");
        const field = at < 0 ? line : line.slice(0, at);
        let value = at < 0 ? "" : line.slice(at + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (field === "event") ev.type = value;
        else if (field === "data") ev.data.push(value);
        else if (field === "id" && !value.includes("\0")) ev.id = value;
        else if (field === "retry" && /^\d+$/.test(value)) ev.retry = Number(value);
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

function blankEvent() {
  return { type: "message", data: [], id: null, retry: null };
}

function onEvent(entry, runId, ev) {
  if (!entry.run || entry.run.id !== runId) return;
  let data = {};
  try {
    data = JSON.parse(ev.data);
  } catch {
    return;
  }
  const { done, target } = progressOf(data);
  const run = { ...entry.run, questions: { done, target } };
  for (const field of ["cost_usd", "spent_usd", "budget_usd"]) {
    if (num(data[field]) !== null) run[field] = data[field];
  }
  if (ev.type === "progress" && !FINAL.has(run.state)) {
    run.state = data.state || "running";
    run.pause_reason = data.pause_reason ?? null;  // a pause is announced on the stream
    run.pause_code = data.pause_code ?? null;
  }
  if (FINAL.has(ev.type)) run.state = ev.type;
  entry.run = run;
  render(entry);
  if (ev.type === "progress" && state.questions.exam === entry.card.dataset.exam) moreQuestions();
}

// ---- the questions table (keyset pages) -----------------------------------------------

function showQuestions(slug) {
  state.questions = { exam: slug, after: null, count: 0 };
  $("#q-exam").textContent = slug;
  $("#q-rows").replaceChildren();
  $("#questions").hidden = false;
  moreQuestions();
}

function reloadQuestions() {
  if (state.questions.exam) showQuestions(state.questions.exam);
}

let loadingQuestions = false;

// Keyset pagination: `after` is the cursor the last page gave, so pages stay stable while
// generation adds rows; new rows come on the next call.
async function moreQuestions() {
  const q = state.questions;
  if (!q.exam || loadingQuestions) return;
  loadingQuestions = true;
  try {
    for (;;) {
      const params = new URLSearchParams({ limit: String(PAGE_SIZE) });
      if (q.after !== null) params.set("after", q.after);
      const { data } = await api(`/exams/${encodeURIComponent(q.exam)}/questions?${params}`);
      const items = Array.isArray(data) ? data : data.items ?? data.questions ?? [];
      if (q !== state.questions) return;
      for (const item of items) $("#q-rows").append(questionRow(item));
      q.count += items.length;
      const next = Array.isArray(data) ? null : data.next ?? null;
      // No `next`: the last page for now. Later rows come after the last id shown.
      const last = items.length ? items[items.length - 1].id : undefined;
      const cursor = next ?? last;
      if (cursor !== null && cursor !== undefined) q.after = String(cursor);
      if (!items.length || next === null) break;
    }
    $("#q-count").textContent = `${q.count} shown`;
  } catch (err) {
    notice(err);
  } finally {
    loadingQuestions = false;
  }
}

function questionRow(item) {
  const tr = document.createElement("tr");
  tr.dataset.chapter = item.chapter_id ?? item.chapter ?? "";
  tr.dataset.number = item.number ?? "";
  const cells = [tr.dataset.chapter, tr.dataset.number, item.question ?? ""];
  cells.forEach((text, i) => {
    const td = document.createElement("td");
    td.textContent = String(text);
    if (i === 2) inLanguage(td, item.language).classList.add("q-text");
    tr.append(td);
  });
  const td = document.createElement("td");
  const ol = document.createElement("ol");
  ol.className = "choices";
  inLanguage(ol, item.language);
  const answer = item.answer_index ?? item.answer;
  (item.choices || []).forEach((choice, i) => {
    const li = choiceItem(choice, i, i === answer, item.language);
    if (i === answer) {
      li.className = "correct";
      li.title = "the correct answer";
    }
    ol.append(li);
  });
  td.append(ol);
  tr.append(td);
  return tr;
}

// ---- the review: approve, reject, edit, each save naming the version it was made from ----
//
// Every action sends If-Match with the version the page showed. A save from a version that is
// no longer current is refused by the server (409, with the current question): the page says
// so on the question, shows the current text, keeps an edit's unsaved text in its form, and
// changes nothing until the reviewer saves again, knowingly, from the current version. The
// bulk approve sends each shown question's version the same way, in one request, and shows a
// refused one's 409 on its card.

const FILTERS = ["disputed", "unreviewed", "edited", "stale", "approved", "rejected"];
const BULK_MAX = 1000; // questions per bulk request (the API's cap)
// question id -> {node, q, editing}; `seq` tells a late answer from a view left since.
const review = { exam: null, filter: "", questions: new Map(), current: null, seq: 0,
                 bulking: false };

// The hash's parameters (#run=ID&review=SLUG&filter=NAME): set (null removes), others kept.
function setHash(values) {
  const hash = new URLSearchParams(location.hash.slice(1));
  for (const [key, value] of Object.entries(values)) {
    if (value === null || value === "") hash.delete(key);
    else hash.set(key, value);
  }
  history.replaceState(null, "", hash.toString() ? `#${hash}` : location.pathname);
}

function chapterUrl(slug, chapterId, filter) {
  const query = filter ? `?${new URLSearchParams({ filter })}` : "";
  return `/exams/${encodeURIComponent(slug)}/chapters/${encodeURIComponent(chapterId)}/questions${query}`;
}

async function showReview(slug, filter = "") {
  const seq = ++review.seq;
  review.exam = slug;
  review.filter = FILTERS.includes(filter) ? filter : "";
  review.questions = new Map();
  review.current = null;
  setHash({ review: slug, filter: review.filter });
  $("#r-exam").textContent = slug;
  $("#r-chapters").replaceChildren();
  $("#r-bulk-result").textContent = "";
  for (const b of document.querySelectorAll("#r-filters button")) {
    b.setAttribute("aria-pressed", String(b.dataset.filter === review.filter));
  }
  updateBulk();
  $("#review").hidden = false;
  try {
    const summary = await reviewSummary(slug);
    // Every chapter read at once, then shown at once: one round trip's wait, one layout.
    const pages = await Promise.all(summary.chapters.map(
      (ch) => api(chapterUrl(slug, ch.chapter_id, review.filter))));
    if (seq !== review.seq) return; // another exam or filter was asked for meanwhile
    const blocks = summary.chapters.map((ch, i) => chapterBlock(ch, pages[i].data.items));
    $("#r-chapters").replaceChildren(...blocks);
    renderCounts(summary);
    updateBulk();
    $("#review").scrollIntoView({ block: "start" });
    // For the speed test (and anyone curious): when the last card is laid out.
    requestAnimationFrame(() => setTimeout(() => performance.mark("review-rendered"), 0));
  } catch (err) {
    notice(err);
  }
}

// The bank first; the questions withdrawn from it (rejected, or disputed under
// VERIFY=replace) under their own heading, by the number they had. A filtered view leaves
// out the chapters with nothing to show.
function chapterBlock(ch, items) {
  const block = $("#review-chapter").content.firstElementChild.cloneNode(true);
  block.dataset.chapter = ch.chapter_id;
  $(".r-title", block).textContent = ch.title;
  $(".r-id", block).textContent = ch.chapter_id;
  const bank = document.createDocumentFragment();
  const gone = document.createDocumentFragment();
  for (const q of items) (q.withdrawn ? gone : bank).append(reviewRow(q));
  $(".r-questions", block).append(bank);
  $(".r-withdrawn", block).append(gone);
  $(".r-withdrawn-part", block).hidden = !items.some((q) => q.withdrawn);
  block.hidden = Boolean(review.filter) && items.length === 0;
  return block;
}

async function reviewSummary(slug) {
  return (await api(`/exams/${encodeURIComponent(slug)}/review`)).data;
}

function renderCounts(summary) {
  const t = summary.totals;
  $("#r-totals").textContent = `${t.questions} in the bank: ${t.unreviewed} to review, ` +
    `${t.approved} approved · ${t.rejected} rejected` +
    (t.stale ? ` · ${t.stale} stale (reviewed before the chapter was regenerated)` : "") +
    (t.disputed ? ` · ${t.disputed} disputed by the blind solve` : "") +
    (t.unverified ? ` · ${t.unverified} unverified (no blind-solve verdict yet)` : "");
  const filters = summary.filters || {};
  for (const b of document.querySelectorAll("#r-filters button[data-filter]")) {
    const n = $(".n", b);
    if (n) n.textContent = filters[b.dataset.filter] ?? "";
  }
  for (const ch of summary.chapters) {
    const block = document.querySelector(`.r-chapter[data-chapter="${CSS.escape(ch.chapter_id)}"]`);
    if (!block) continue;
    $(".r-counts", block).textContent = `${ch.questions}/${ch.target} in the bank · ` +
      `${ch.unreviewed} to review · ${ch.approved} approved · ${ch.rejected} rejected` +
      (ch.stale ? ` · ${ch.stale} stale` : "") +
      (ch.disputed === null ? "" : ` · ${ch.disputed} disputed`) +
      (ch.unverified ? ` · ${ch.unverified} unverified` : "");
  }
}

async function refreshCounts() {
  try {
    renderCounts(await reviewSummary(review.exam));
  } catch (err) {
    notice(err);
  }
}

function sourceText(source) {
  if (source === null || source === undefined) return "";
  if (typeof source === "string") return source;
  const parts = [source.file, source.page ?? source.heading, source.passage ?? source.text]
    .filter((p) => p !== null && p !== undefined && p !== "");
  return parts.length ? parts.join(" · ") : JSON.stringify(source);
}

// A question's card. Its buttons and form are handled by one listener on the view (`onCard`),
// not five per card: a 500-question chapter makes 500 cards.
function reviewRow(q) {
  const node = $("#review-question").content.firstElementChild.cloneNode(true);
  const entry = { node, q, editing: false };
  review.questions.set(q.id, entry);
  renderQuestion(entry);
  return node;
}

function entryOf(node) {
  const card = node && node.closest && node.closest("article.rq");
  return card ? review.questions.get(Number(card.dataset.id)) : undefined;
}

function onCard(ev) {
  const entry = entryOf(ev.target);
  if (!entry) return;
  focusQuestion(entry, false);
  const button = ev.target.closest("button");
  if (!button) return;
  if (button.classList.contains("rq-approve")) act(entry, "approve");
  else if (button.classList.contains("rq-reject")) act(entry, "reject");
  else if (button.classList.contains("rq-edit")) openEdit(entry);
  else if (button.classList.contains("rq-cancel")) closeEdit(entry);
}

// Who acted: a name, or (a token's hash, before named tokens) its first 8 digits.
function who(client) {
  return /^[0-9a-f]{32}$/.test(client) ? client.slice(0, 8) : client;
}

// ---- the bulk approve of what the filter shows ----------------------------------------

// The cards shown that an approve would change: in the bank, not approved yet.
function approvable() {
  return [...review.questions.values()].filter(({ node, q }) =>
    !q.withdrawn && q.review !== "rejected" && q.review !== "approved" && node.isConnected
    && !node.closest("[hidden]"));
}

function updateBulk() {
  const n = approvable().length;
  const button = $("#r-bulk");
  button.textContent = n ? `approve the ${n} shown` : "approve all shown";
  button.disabled = n === 0 || review.bulking === true;
}

async function bulkApprove() {
  if (!can("reviewer") || review.bulking) return;
  const entries = approvable();
  if (!entries.length) return;
  review.bulking = true;
  updateBulk();
  const slug = review.exam;
  let approved = 0;
  let refused = 0;
  try {
    for (let i = 0; i < entries.length; i += BULK_MAX) {
      const part = entries.slice(i, i + BULK_MAX);
      const sent = new Map(part.map((e) => [e.q.id, e.q.version]));
      const { data } = await api(`/exams/${encodeURIComponent(slug)}/review/approve`, {
        method: "POST", body: { items: part.map((e) => ({ id: e.q.id, version: e.q.version })) } });
      if (review.exam !== slug) return;
      for (const item of data.items) {
        const entry = review.questions.get(item.id);
        if (!entry) continue;
        if (item.status === 200) approved += 1;
        else refused += 1;
        showApproval(entry, item, sent.get(item.id));
      }
    }
    $("#r-bulk-result").textContent = `${approved} approved` + (refused
      ? ` · ${refused} not approved: changed by someone since you read them, or gone (shown on each)` : "");
    refreshCounts();
  } catch (err) {
    notice(err);
  } finally {
    review.bulking = false;
    updateBulk();
  }
}

// One question's answer in a bulk approve: approved, or refused with the question as it is
// now (a 409: someone saved it since; nothing was approved over their change).
function showApproval(entry, item, mine) {
  if (item.question) entry.q = item.question;
  renderQuestion(entry);
  const box = $(".rq-conflict", entry.node);
  box.hidden = item.status === 200;
  if (item.status === 200) return;
  const by = item.question && item.question.reviewed_by ? ` by ${who(item.question.reviewed_by)}` : "";
  box.textContent = item.status === 409 && item.version !== mine
    ? `Not approved (409): someone saved this question${by} since you read it (you had ` +
      `version ${mine}, it is now version ${item.version}). What is shown is the current ` +
      "version: look at it and approve it again."
    : `Not approved (${item.status}): ${item.detail}`;
}

// ---- the keyboard ---------------------------------------------------------------------

// The question the keys act on: marked, and scrolled to when the keys moved to it.
function focusQuestion(entry, scroll = true) {
  if (review.current && review.current !== entry) review.current.node.classList.remove("rq-current");
  review.current = entry;
  if (!entry) return;
  entry.node.classList.add("rq-current");
  if (scroll) entry.node.scrollIntoView({ block: "nearest" });
}

function shownEntries() {
  return [...document.querySelectorAll("#r-chapters article.rq")]
    .filter((node) => !node.closest("[hidden]"))
    .map((node) => review.questions.get(Number(node.dataset.id)))
    .filter(Boolean);
}

function move(step) {
  const shown = shownEntries();
  if (!shown.length) return;
  const at = shown.indexOf(review.current);
  const next = at < 0 ? (step > 0 ? 0 : shown.length - 1)
    : Math.min(shown.length - 1, Math.max(0, at + step));
  focusQuestion(shown[next]);
}

const KEYS = {
  j: () => move(1),
  k: () => move(-1),
  a: (entry) => { if (entry) { act(entry, "approve"); move(1); } },
  R: (entry) => { if (entry) { act(entry, "reject"); move(1); } },
  e: (entry) => { if (entry) openEdit(entry); },
};
const REVIEW_KEYS = new Set(["a", "R", "e"]); // need the reviewer role

function onKey(ev) {
  if ($("#review").hidden || ev.ctrlKey || ev.metaKey || ev.altKey) return;
  const typing = ev.target.closest && ev.target.closest("input, textarea, select");
  if (typing) {
    const entry = entryOf(ev.target);
    if (ev.key === "Escape" && entry) {
      closeEdit(entry);
      entry.node.focus();
    }
    return;
  }
  const run = KEYS[ev.key];
  if (!run || (REVIEW_KEYS.has(ev.key) && !can("reviewer"))) return;
  ev.preventDefault();
  run(review.current);
}

function renderQuestion(entry) {
  const { node, q } = entry;
  node.dataset.id = q.id;
  node.tabIndex = -1; // focusable: Esc in its form gives the keys back to the view
  node.dataset.chapter = q.chapter_id;
  node.dataset.number = q.number;
  node.dataset.version = q.version;
  node.dataset.review = q.review;
  if (q.withdrawn) node.dataset.withdrawn = q.withdrawn;
  else delete node.dataset.withdrawn;
  $(".rq-num", node).textContent = `#${q.number}`;
  const st = $(".rq-state", node);
  st.textContent = q.withdrawn && q.review !== "rejected" ? `withdrawn (${q.withdrawn})` : q.review;
  st.dataset.state = q.review;
  const verdict = $(".rq-verdict", node);
  verdict.textContent = q.verdict ? `solve: ${q.verdict}` : "";
  verdict.dataset.verdict = q.verdict || "";
  // The solver's choice beside the key: what a reviewer weighs a disputed question by.
  const solved = $(".rq-solved", node);
  solved.textContent = q.solved_index === null || q.solved_index === undefined ? "" :
    `solver chose ${String.fromCharCode(65 + q.solved_index)}, key ${String.fromCharCode(65 + q.answer_index)}`;
  const kind = q.type || "mcq";
  node.dataset.type = kind;
  const typeBadge = $(".rq-type", node);
  typeBadge.textContent = TYPE_NAMES[kind] || kind;
  typeBadge.hidden = kind === "mcq";
  if (kind !== "mcq" && q.solved_answer !== null && q.solved_answer !== undefined) {
    // An item of another type: the solver's own answer beside the key.
    solved.textContent = `solver answered ${answerText(q, q.solved_answer)}`;
  }
  const key = $(".rq-key", node);
  key.hidden = kind === "mcq" || kind === "multi";
  key.textContent = key.hidden ? "" : `key: ${keyText(q)}`;
  const stale = $(".rq-stale", node);
  stale.textContent = q.stale ? `stale: ${q.stale} since it was reviewed; approve it again, ` +
    "edit or reject it" : "";
  stale.hidden = !q.stale;
  $(".rq-levels", node).textContent = [q.difficulty, q.bloom].filter(Boolean).join(" · ");
  const by = q.reviewed_by ? ` · by ${who(q.reviewed_by)} ${q.reviewed_at || ""}` : "";
  $(".rq-version", node).textContent = `v${q.version}${q.edited ? " · edited" : ""}${by}`;
  inLanguage($(".rq-text", node), q.language).textContent = q.question;
  const ol = $(".rq-choices", node);
  inLanguage(ol, q.language);
  const correct = kind === "multi" ? new Set(q.correct || []) : new Set([q.answer_index]);
  ol.replaceChildren(...q.choices.map((choice, i) => {
    const li = choiceItem(choice, i, correct.has(i), q.language);
    if (correct.has(i)) li.className = "correct";
    if (i === q.solved_index) {  // the blind solve's pick, marked beside the key
      const mark = document.createElement("span");
      mark.className = "solver-mark";
      mark.dir = "ltr"; // the page's words: not what the choice's direction is taken from
      mark.textContent = "solver's pick → ";
      li.prepend(mark);
      li.classList.add("solved");
    }
    return li;
  }));
  inLanguage($(".rq-expl", node), q.language).textContent = q.explanation;
  const source = sourceText(q.source);
  $(".rq-source", node).textContent = source ? `source: ${source}` : "";
  // A withdrawn question (rejected, or disputed and replaced) is out of the bank for good:
  // no action applies to it, so it shows none.
  const final = q.review === "rejected" || Boolean(q.withdrawn);
  $(".rq-actions", node).hidden = final;
  $(".rq-approve", node).disabled = final || q.review === "approved";
  $(".rq-reject", node).disabled = final;
  $(".rq-edit", node).disabled = final;
  if (final && entry.editing) closeEdit(entry);
  const block = node.closest(".r-chapter");
  if (final && block && !node.closest(".r-withdrawn")) {  // rejected just now: out of the bank
    $(".r-withdrawn", block).append(node);
    $(".r-withdrawn-part", block).hidden = false;
  }
}

// The item types other than four-choice questions (examforge.item_types), as the page
// names them; each one's key in words, and a solver's answer to it.
const TYPE_NAMES = { mcq: "four choices", multi: "select all", truefalse: "true or false",
                     short: "short answer", numeric: "number" };

function answerText(q, given) {
  if (q.type === "multi") return (given || []).map((i) => String.fromCharCode(65 + i)).join(", ");
  if (q.type === "truefalse") return given ? "true" : "false";
  if (q.type === "numeric") return `${given}${q.unit ? ` ${q.unit}` : ""}`;
  return `“${given}”`;
}

function keyText(q) {
  if (q.type === "truefalse") return q.answer ? "true" : "false";
  if (q.type === "short") return (q.accepted || []).map((a) => `“${a}”`).join(" or ");
  if (q.type === "numeric") {
    const unit = q.unit ? ` ${q.unit}` : "";
    const tol = q.relative ? `${q.tolerance * 100} %` : `${q.tolerance}${unit}`;
    return `${q.value}${unit} ± ${tol}`;
  }
  return "";
}

// The form's fields for the item's type: the others are hidden and disabled (a disabled
// field is neither validated nor sent).
function showTypeFields(node, kind) {
  node.querySelectorAll(".rq-form [data-types]").forEach((el) => {
    const on = el.dataset.types.split(" ").includes(kind);
    el.hidden = !on;
    el.querySelectorAll("input, select, textarea").forEach((f) => { f.disabled = !on; });
  });
  const fixed = kind === "mcq" || kind === "multi";
  [...node.querySelectorAll(".rq-f-choice:not(.rq-f-extra)")].forEach((input) => {
    input.closest("label").hidden = !fixed;
    input.disabled = !fixed;
  });
}

// The choices the form holds for the item's type: four (mcq), or four to six (multi: the
// extra ones when filled in).
function formChoices(node) {
  return [...node.querySelectorAll(".rq-f-choice")].filter((input) => !input.disabled)
    .map((input) => input.value).filter((v, i) => i < 4 || v.trim() !== "");
}

// The type's answer fields as the form shows them, and as PATCH takes them.
function typedForm(node, kind) {
  if (kind === "multi") {
    return { correct: [...node.querySelectorAll(".rq-f-correct")].filter((c) => c.checked)
      .map((c) => Number(c.value)) };
  }
  if (kind === "truefalse") return { answer: $(".rq-f-tf", node).value === "true" };
  if (kind === "short") {
    return { accepted: $(".rq-f-accepted", node).value.split("\n").map((a) => a.trim())
      .filter(Boolean) };
  }
  if (kind === "numeric") {
    const unit = $(".rq-f-unit", node).value.trim();
    return { value: Number($(".rq-f-value", node).value),
             tolerance: Number($(".rq-f-tolerance", node).value),
             relative: $(".rq-f-relative", node).checked, unit: unit || null };
  }
  return {};
}

function setTypedForm(node, kind, v) {
  if (kind === "multi") {
    node.querySelectorAll(".rq-f-correct").forEach((c) => {
      c.checked = (v.correct || []).includes(Number(c.value));
    });
  } else if (kind === "truefalse") {
    $(".rq-f-tf", node).value = v.answer ? "true" : "false";
  } else if (kind === "short") {
    $(".rq-f-accepted", node).value = (v.accepted || []).join("\n");
  } else if (kind === "numeric") {
    $(".rq-f-value", node).value = v.value ?? "";
    $(".rq-f-tolerance", node).value = v.tolerance ?? "";
    $(".rq-f-relative", node).checked = Boolean(v.relative);
    $(".rq-f-unit", node).value = v.unit || "";
  }
}

function openEdit(entry) {
  const { node, q } = entry;
  if (!can("reviewer") || q.review === "rejected" || q.withdrawn) return;
  entry.editing = true;
  entry.base = q.version; // the version this edit is made from
  // What the form was opened with: a save sends only the fields the reviewer changed, so
  // that saving again after a conflict never puts back another reviewer's changed field.
  const kind = q.type || "mcq";
  entry.opened = { question: q.question, choices: [...q.choices], answer_index: q.answer_index,
                   explanation: q.explanation };
  showTypeFields(node, kind);
  setTypedForm(node, kind, q);
  Object.assign(entry.opened, typedForm(node, kind));
  if (kind !== "mcq" && kind !== "multi") delete entry.opened.choices;
  if (kind !== "mcq") delete entry.opened.answer_index;
  inLanguage($(".rq-f-question", node), q.language).value = q.question;
  [...node.querySelectorAll(".rq-f-choice")].forEach((input, i) => {
    inLanguage(input, q.language).value = q.choices[i] ?? "";
  });
  $(".rq-f-answer", node).value = String(q.answer_index);
  inLanguage($(".rq-f-explanation", node), q.language).value = q.explanation;
  $(".rq-form", node).hidden = false;
  $(".rq-conflict", node).hidden = true;
  $(".rq-f-question", node).focus();
}

function closeEdit(entry) {
  entry.editing = false;
  $(".rq-form", entry.node).hidden = true;
}

function showConflict(entry, err, what) {
  if (err.problem && err.problem.duplicate_of) {
    // Not a version conflict: the text is one the bank has. The form keeps the reviewer's.
    const box = $(".rq-conflict", entry.node);
    box.textContent = `Not saved (409): ${err.problem.detail}`;
    box.hidden = false;
    return;
  }
  const current = err.problem && err.problem.question;
  const mine = what === "edit" ? entry.base : entry.q.version;
  if (current) entry.q = current;
  renderQuestion(entry);
  const box = $(".rq-conflict", entry.node);
  const now = current ? current.version : err.problem && err.problem.version;
  const by = current && current.reviewed_by ? ` by ${who(current.reviewed_by)}` : "";
  box.textContent = `Conflict (409): not saved. Someone saved this question${by} since you ` +
    `opened it (you had version ${mine}, it is now version ${now}). What is shown is the ` +
    `current version` + (what === "edit" ? "; your text is still in the form: save again " +
    "to apply it over the current version, or cancel." : ": look at it and act again.");
  box.hidden = false;
  if (what === "edit" && current) rebase(entry, current);
}

// After a conflict, the form is made from the current version: the fields the reviewer did
// not touch take their current values (another reviewer's changes), the ones they changed
// keep their text, and a second save is made from the current version, sending only those.
function rebase(entry, current) {
  const { node } = entry;
  const inputs = [...node.querySelectorAll(".rq-f-choice")];
  const fields = {
    question: [() => $(".rq-f-question", node).value, (v) => { $(".rq-f-question", node).value = v; }],
    choices: [() => formChoices(node), (v) => inputs.forEach((i, n) => { i.value = v[n] ?? ""; })],
    answer_index: [() => Number($(".rq-f-answer", node).value), (v) => { $(".rq-f-answer", node).value = String(v); }],
    explanation: [() => $(".rq-f-explanation", node).value, (v) => { $(".rq-f-explanation", node).value = v; }],
  };
  const kind = current.type || "mcq";
  for (const [field, [get, set]] of Object.entries(fields)) {
    if (!(field in entry.opened)) continue; // not a field of this type
    if (JSON.stringify(get()) === JSON.stringify(entry.opened[field])) set(current[field]);
    entry.opened[field] = current[field];
  }
  // The type's answer fields, likewise.
  const mine = typedForm(node, kind);
  setTypedForm(node, kind, current);
  const theirs = typedForm(node, kind);
  const merged = {};
  for (const field of Object.keys(mine)) {
    const changed = JSON.stringify(mine[field]) !== JSON.stringify(entry.opened[field]);
    merged[field] = changed ? mine[field] : theirs[field];
    entry.opened[field] = theirs[field];
  }
  setTypedForm(node, kind, { ...current, ...merged });
  entry.base = current.version;
}

async function send(entry, path, init) {
  const { data } = await api(path, init);
  entry.q = data;
  $(".rq-conflict", entry.node).hidden = true;
  renderQuestion(entry);
  updateBulk();
  refreshCounts();
}

async function act(entry, action) {
  const q = entry.q;
  const final = q.review === "rejected" || Boolean(q.withdrawn);
  if (!can("reviewer") || final || (action === "approve" && q.review === "approved")) return;
  try {
    await send(entry, `/exams/${encodeURIComponent(review.exam)}/questions/${q.id}/${action}`, {
      method: "POST", headers: { "If-Match": `"${q.version}"` } });
    if (action === "reject") closeEdit(entry);
  } catch (err) {
    if (err instanceof ApiError && err.status === 409) return showConflict(entry, err, action);
    notice(err);
  }
}

async function saveEdit(entry) {
  const { node, q } = entry;
  const kind = q.type || "mcq";
  // The choices the type has: four (mcq), four to six (multi: the extra ones when filled).
  const form = {
    question: $(".rq-f-question", node).value,
    choices: formChoices(node),
    answer_index: Number($(".rq-f-answer", node).value),
    explanation: $(".rq-f-explanation", node).value,
    ...typedForm(node, kind),
  };
  const body = {};
  for (const [field, value] of Object.entries(form)) {
    if (!(field in entry.opened)) continue; // not a field of this type
    if (JSON.stringify(value) !== JSON.stringify(entry.opened[field])) body[field] = value;
  }
  if (!Object.keys(body).length) return closeEdit(entry); // nothing changed
  try {
    await send(entry, `/exams/${encodeURIComponent(review.exam)}/questions/${q.id}`, {
      method: "PATCH", body, headers: { "If-Match": `"${entry.base}"` } });
    closeEdit(entry);
  } catch (err) {
    if (err instanceof ApiError && err.status === 409) return showConflict(entry, err, "edit");
    const box = $(".rq-conflict", node);
    box.textContent = `Not saved: ${err.message}`;
    box.hidden = false;
    if (err instanceof AuthError) notice(err);
  }
}

// ---- start-up -------------------------------------------------------------------------

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function enter() {
  $("#login").hidden = true;
  $("#app").hidden = false;
  $("#who").hidden = false;
  // The exams' cards once the role is known, so that a card never shows a control its role
  // lacks for a moment; the review need not wait for it (it offers no action until then).
  loadMe().then(() => loadExams(), notice);
  // A reload or a shared link (#review=SLUG&filter=NAME) opens the same review view.
  const hash = new URLSearchParams(location.hash.slice(1));
  if (hash.get("review")) showReview(hash.get("review"), hash.get("filter") || "");
}

document.addEventListener("DOMContentLoaded", () => {
  $("#login").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const value = $("#token").value.trim();
    if (!value) return;
    sessionStorage.setItem(TOKEN_KEY, value);
    $("#token").value = "";
    enter();
  });
  $("#forget").addEventListener("click", () => askToken());
  $("#refresh").addEventListener("click", () => loadExams());
  $("#exams-more").addEventListener("click", () => loadExams(true));
  $("#q-more").addEventListener("click", moreQuestions);
  $("#r-close").addEventListener("click", () => {
    review.exam = null;
    review.seq += 1;
    $("#review").hidden = true;
    setHash({ review: null, filter: null });
  });
  $("#r-filters").addEventListener("click", (ev) => {
    const button = ev.target.closest("button[data-filter]");
    if (button && review.exam) showReview(review.exam, button.dataset.filter);
  });
  $("#r-bulk").addEventListener("click", bulkApprove);
  $("#r-chapters").addEventListener("click", onCard);
  $("#r-chapters").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const entry = entryOf(ev.target);
    if (entry) saveEdit(entry);
  });
  document.addEventListener("keydown", onKey);
  setInterval(refreshBatchRuns, BATCH_REFRESH_MS);
  if (token()) enter();
  else askToken();
});
