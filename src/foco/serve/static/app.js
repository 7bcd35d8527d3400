// The foco web page: choose or upload a reference, draw an optional box, type the instruction, see the top k.
"use strict";
const $ = (id) => document.getElementById(id);
const state = { refId: null, refFile: null, refImage: null, size: null, box: null, offset: 0, searched: false };
const canvas = $("ref-canvas");
const ctx = canvas.getContext("2d");

function setStatus(msg, isError) {
  $("status").textContent = msg;
  $("status").className = isError ? "error" : "";
}

async function init() {
  const health = await (await fetch("/healthz")).json();
  for (const m of health.methods) {
    const o = document.createElement("option");
    o.value = m; o.textContent = m;
    $("method").appendChild(o);
  }
  $("k").max = health.max_k;
  await loadGallery();
}

async function loadGallery() {
  const res = await fetch(`/gallery?offset=${state.offset}&limit=60`);
  const page = await res.json();
  for (const item of page.items) {
    const b = document.createElement("button");
    b.type = "button";
    b.setAttribute("role", "listitem");
    b.setAttribute("aria-pressed", "false");
    b.setAttribute("aria-label", `Use image ${item.id} (${item.path}) as the reference`);
    b.dataset.id = item.id;
    const img = document.createElement("img");
    img.src = item.thumbnail_url; img.alt = ""; img.loading = "lazy";
    b.appendChild(img);
    b.addEventListener("click", () => chooseIndexed(item, b));
    $("gallery").appendChild(b);
  }
  state.offset += page.items.length;
  $("more").hidden = state.offset >= page.total;
}

function chooseIndexed(item, button) {
  document.querySelectorAll(".gallery button").forEach((x) => x.setAttribute("aria-pressed", "false"));
  button.setAttribute("aria-pressed", "true");
  state.refId = item.id; state.refFile = null; $("upload").value = "";
  loadReference(`/images/${item.id}`, `Reference: image ${item.id} (${item.path})`);
}

function loadReference(url, caption) {
  const img = new Image();
  img.onload = () => {
    state.refImage = img; state.size = [img.naturalWidth, img.naturalHeight];
    clearBox(false); draw(); $("heatmap").hidden = true;
    $("ref-caption").textContent = `${caption}, ${img.naturalWidth} x ${img.naturalHeight}`;
  };
  img.src = url;
}

function draw() {
  ctx.imageSmoothingEnabled = false;
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  if (state.refImage) ctx.drawImage(state.refImage, 0, 0, canvas.width, canvas.height);
  if (state.box && state.size) {
    const [x0, y0, x1, y1] = state.box;
    const sx = canvas.width / state.size[0], sy = canvas.height / state.size[1];
    ctx.strokeStyle = "#ffea00"; ctx.lineWidth = 3;
    ctx.strokeRect(x0 * sx, y0 * sy, (x1 - x0) * sx, (y1 - y0) * sy);
  }
}

function setBox(box, submit) {
  state.box = box;
  ["x0", "y0", "x1", "y1"].forEach((k, i) => { $(k).value = box ? Math.round(box[i]) : ""; });
  draw();
  if (submit && state.searched) search();
}

function clearBox(submit) { setBox(null, submit); }

function toImage(ev) {
  const r = canvas.getBoundingClientRect();
  const x = Math.min(Math.max(ev.clientX - r.left, 0), r.width) / r.width * state.size[0];
  const y = Math.min(Math.max(ev.clientY - r.top, 0), r.height) / r.height * state.size[1];
  return [x, y];
}

let dragStart = null;
canvas.addEventListener("pointerdown", (ev) => {
  if (!state.size) return;
  dragStart = toImage(ev); canvas.setPointerCapture(ev.pointerId);
});
canvas.addEventListener("pointermove", (ev) => {
  if (!dragStart) return;
  const [x, y] = toImage(ev);
  state.box = [Math.min(dragStart[0], x), Math.min(dragStart[1], y), Math.max(dragStart[0], x), Math.max(dragStart[1], y)];
  draw();
});
canvas.addEventListener("pointerup", (ev) => {
  if (!dragStart) return;
  const [x, y] = toImage(ev);
  const box = [Math.min(dragStart[0], x), Math.min(dragStart[1], y), Math.max(dragStart[0], x), Math.max(dragStart[1], y)];
  dragStart = null;
  if (box[2] - box[0] < 1 || box[3] - box[1] < 1) { clearBox(false); return; }
  setBox(box, true);
});
["x0", "y0", "x1", "y1"].forEach((k) => $(k).addEventListener("change", () => {
  const v = ["x0", "y0", "x1", "y1"].map((n) => parseFloat($(n).value));
  if (v.every((x) => Number.isFinite(x))) setBox(v, false);
}));
$("clear-box").addEventListener("click", () => clearBox(true));
$("more").addEventListener("click", loadGallery);
$("upload").addEventListener("change", () => {
  const f = $("upload").files[0];
  if (!f) return;
  document.querySelectorAll(".gallery button").forEach((x) => x.setAttribute("aria-pressed", "false"));
  state.refFile = f; state.refId = null;
  loadReference(URL.createObjectURL(f), `Reference: uploaded ${f.name}`);
});

async function search() {
  if (state.refId === null && !state.refFile) { setStatus("Choose or upload a reference image first.", true); return; }
  const text = $("text").value.trim();
  if (!text) { setStatus("Type the modification first.", true); $("text").focus(); return; }
  const form = new FormData();
  if (state.refFile) form.append("image", state.refFile); else form.append("reference_id", state.refId);
  form.append("text", text);
  form.append("method", $("method").value);
  form.append("k", $("k").value);
  form.append("chord", $("chord").value || "0");
  if (state.box) form.append("box", state.box.map((v) => v.toFixed(2)).join(","));
  setStatus("Searching...", false);
  $("submit").disabled = true;
  try {
    const res = await fetch("/search", { method: "POST", body: form });
    const body = await res.json();
    if (!res.ok) { setStatus(`Error ${res.status}: ${body.error}`, true); return; }
    state.searched = true;
    render(body);
    setStatus(`${body.results.length} results from ${body.method}${state.box ? " with the box" : ""} in ${body.elapsed_ms} ms.`, false);
  } catch (e) {
    setStatus(`The server did not answer (${e}).`, true);
  } finally {
    $("submit").disabled = false;
  }
}

function render(body) {
  const list = $("results");
  list.replaceChildren();
  body.results.forEach((r, i) => {
    const li = document.createElement("li");
    li.className = "result-tile"; li.dataset.id = r.id; li.dataset.score = r.score;
    const a = document.createElement("a");
    a.href = r.image_url; a.target = "_blank"; a.rel = "noopener";
    const img = document.createElement("img");
    img.src = r.thumbnail_url; img.alt = `Result ${i + 1}: image ${r.id}`;
    a.appendChild(img);
    const cap = document.createElement("div");
    cap.textContent = `#${i + 1} id ${r.id} score ${r.score.toFixed(3)}`;
    li.append(a, cap);
    list.appendChild(li);
  });
  const heat = $("heatmap");
  if (body.attention_url) { heat.src = body.attention_url; heat.hidden = false; } else { heat.hidden = true; }
}

$("query").addEventListener("submit", (ev) => { ev.preventDefault(); search(); });
init().catch((e) => setStatus(`Could not reach the server (${e}).`, true));
