// Memory timeline: the plan's buffers as JSON and as one HTML page with inline SVG
// drawn by an inline script (stacked live bytes, or the arena's actual layout).
#include "plan/memory_timeline.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "plan/plan_report.h"

namespace smelt {

nlohmann::json memory_timeline_json(const StepPlan& plan, const std::string& title) {
  nlohmann::json j;
  j["title"] = title;
  j["arena_bytes"] = plan.memory.arena_bytes;
  j["peak_live_bytes"] = plan.memory.peak_live_bytes;
  j["peak_step"] = plan.memory.peak_step;
  nlohmann::json steps = nlohmann::json::array();
  for (const auto& s : plan.steps) steps.push_back(s.name());
  j["steps"] = steps;
  nlohmann::json classes = nlohmann::json::array();
  for (size_t c = 0; c < static_cast<size_t>(BufferClass::count); ++c)
    classes.push_back(std::string(buffer_class_name(static_cast<BufferClass>(c))));
  j["classes"] = classes;
  const int last = static_cast<int>(plan.steps.size()) - 1;
  nlohmann::json buffers = nlohmann::json::array();
  for (size_t i = 0; i < plan.buffers.size(); ++i) {
    const auto& b = plan.buffers[i];
    const bool persistent = b.request.first_step == 0 && b.request.last_step == last;
    buffers.push_back({{"name", b.request.name},
                       {"bytes", b.request.bytes},
                       {"dtype", std::string(dtype_name(b.dtype))},
                       {"shape", b.shape.str()},
                       {"class", std::string(buffer_class_name(b.request.kind))},
                       {"first_step", b.request.first_step},
                       {"last_step", b.request.last_step},
                       {"offset", plan.memory.offsets[i]},
                       {"made_by", persistent ? std::string("persistent") : plan.steps[b.request.first_step].name()}});
  }
  j["buffers"] = buffers;
  return j;
}

namespace {

// The page: the data is inserted where /*DATA*/ stands; everything else is static.
constexpr const char* kPage = R"PAGE(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>smelt memory timeline</title>
<style>
body{font:13px system-ui,-apple-system,"Segoe UI",sans-serif;margin:16px 24px;color:#1d2433;background:#fafbfc}
h1{font-size:18px;margin:0 0 4px}#summary{color:#4a5468;margin-bottom:8px}
#controls{margin:6px 0 8px}#controls label{margin-right:16px;cursor:pointer}
#legend span{display:inline-block;margin:0 14px 4px 0;white-space:nowrap}
#legend i{display:inline-block;width:11px;height:11px;margin-right:5px;vertical-align:-1px;border-radius:2px}
svg{background:#fff;border:1px solid #dde2ea;border-radius:4px}
.axis{font-size:11px;fill:#4a5468}.grid{stroke:#eef1f5}.phase{font-size:11px;fill:#6b7489}
polygon:hover,rect.buffer:hover{stroke:#111;stroke-width:1.2}
#tip{position:fixed;pointer-events:none;background:#1d2433;color:#fff;padding:7px 9px;border-radius:4px;
font-size:12px;line-height:1.45;display:none;max-width:460px;box-shadow:0 2px 8px rgba(0,0,0,.25)}
#tip b{color:#ffd479}
</style></head><body>
<h1 id="title"></h1><div id="summary"></div>
<div id="controls">
<label><input type="radio" name="view" value="stacked" checked> stacked live bytes</label>
<label><input type="radio" name="view" value="arena"> arena layout (offsets)</label>
<label><input type="checkbox" id="hide" checked> zoom past the persistent state (weights, gradients, optimizer)</label>
</div>
<div id="legend"></div>
<svg id="chart" width="1320" height="640"></svg>
<div id="tip"></div>
<script>
const D = /*DATA*/;
const colors = ["#4e79a7","#f28e2b","#e15759","#76b7b2","#59a14f","#edc948","#b07aa1","#ff9da7","#9c755f","#bab0ac","#17becf"];
const NS = "http://www.w3.org/2000/svg";
const svg = document.getElementById("chart"), tip = document.getElementById("tip");
const W = +svg.getAttribute("width"), H = +svg.getAttribute("height");
const M = {left: 70, right: 16, top: 30, bottom: 44};
const steps = D.steps.length, last = steps - 1;
const GiB = 1073741824;
function human(b){ if(b>=GiB) return (b/GiB).toFixed(2)+" GiB"; if(b>=1048576) return (b/1048576).toFixed(1)+" MiB";
  if(b>=1024) return (b/1024).toFixed(1)+" KiB"; return b+" B"; }
const align = b => Math.ceil(b/256)*256;
D.buffers.forEach((b,i)=>{ b.id=i; b.persistent = b.first_step===0 && b.last_step===last; b.size=align(b.bytes);
  b.classIndex = D.classes.indexOf(b["class"]); });
document.getElementById("title").textContent = D.title;
document.getElementById("summary").textContent = D.buffers.length + " buffers, " + steps + " steps; arena " +
  human(D.arena_bytes) + ", peak live " + human(D.peak_live_bytes) + " at step " + D.peak_step + " (" + D.steps[D.peak_step] + ")";
const totals = D.classes.map(()=>0);
D.buffers.forEach(b=>{ totals[b.classIndex] += b.size; });
document.getElementById("legend").innerHTML = D.classes.map((c,i)=> totals[i] ?
  '<span><i style="background:'+colors[i%colors.length]+'"></i>'+c+' ('+human(totals[i])+')</span>' : "").join("");
function el(name, attrs, parent){ const e=document.createElementNS(NS,name); for(const k in attrs) e.setAttribute(k,attrs[k]);
  (parent||svg).appendChild(e); return e; }
function describe(b){ return "<b>"+b.name+"</b><br>"+human(b.bytes)+" &nbsp; "+b.dtype+" "+b.shape+" &nbsp; "+b["class"]+
  "<br>made by: "+b.made_by+"<br>live: step "+b.first_step+" ("+D.steps[b.first_step]+") to "+b.last_step+" ("+D.steps[b.last_step]+")"; }
function hover(node,b){ node.addEventListener("mousemove",e=>{ tip.innerHTML=describe(b); tip.style.display="block";
  const x=Math.min(e.clientX+14, window.innerWidth-470); tip.style.left=x+"px"; tip.style.top=(e.clientY+14)+"px"; });
  node.addEventListener("mouseleave",()=>{ tip.style.display="none"; }); }
// Step-function bands: for every buffer, the stack height below it at each step of its life.
function stacked(shown, start){
  const order = shown.slice().sort((a,b)=> (b.persistent-a.persistent) || (a.persistent ? a.classIndex-b.classIndex || b.size-a.size : 0)
    || a.first_step-b.first_step || a.id-b.id);
  const bases = order.map(()=>[]), live=[]; let top=0;
  for(let s=0;s<steps;++s){ let base=start;
    order.forEach((b,k)=>{ if(b.first_step<=s && s<=b.last_step){ const seg=bases[k]; if(!seg.length || seg[seg.length-1][1]!==base) seg.push([s,base]); base+=b.size; }});
    live.push(base); top=Math.max(top,base); }
  return {order, bases, top, live};
}
function draw(){
  while(svg.firstChild) svg.removeChild(svg.firstChild);
  const view = document.querySelector('input[name=view]:checked').value, hide = document.getElementById("hide").checked;
  const shown = D.buffers.filter(b=>!(hide && b.persistent));
  const persistentBytes = D.buffers.filter(b=>b.persistent).reduce((t,b)=>t+b.size,0);
  const layout = view==="stacked" ? stacked(shown, hide ? persistentBytes : 0) : null;
  let top = layout ? layout.top : Math.max(...shown.map(b=>b.offset+b.size));
  let floor = 0;
  if(hide) floor = view==="arena" ? Math.min(...shown.map(b=>b.offset)) : persistentBytes;
  floor = Math.floor(floor/GiB)*GiB;
  const x = s => M.left + (W-M.left-M.right) * s / steps;
  const y = v => H-M.bottom - (H-M.top-M.bottom) * (v-floor) / Math.max(1, top-floor);
  // Grid and axes.
  const tick = Math.pow(2, Math.ceil(Math.log2(Math.max(1,(top-floor)/GiB/8)))) * GiB;
  for(let v=Math.ceil(floor/tick)*tick; v<=top; v+=tick){ el("line",{x1:M.left,x2:W-M.right,y1:y(v),y2:y(v),class:"grid"});
    el("text",{x:M.left-6,y:y(v)+4,"text-anchor":"end",class:"axis"}).textContent=(v/GiB).toFixed(tick<GiB?2:0)+" GiB"; }
  const stepTick = Math.max(1, Math.pow(10, Math.floor(Math.log10(steps/6))));
  for(let s=0;s<=steps;s+=stepTick){ el("text",{x:x(s),y:H-M.bottom+14,"text-anchor":"middle",class:"axis"}).textContent=s; }
  el("text",{x:(M.left+W-M.right)/2,y:H-6,"text-anchor":"middle",class:"axis"}).textContent="plan step";
  // Phases along the top.
  let phase=null, start=0;
  const phaseOf = n => n.startsWith("forward+backward") ? "output head" : n.startsWith("recompute") ? "backward (with recompute)"
    : n.startsWith("backward layers") ? "backward (with recompute)" : n.startsWith("forward") ? "forward" : "optimizer";
  for(let s=0;s<=steps;++s){ const p = s<steps ? phaseOf(D.steps[s]) : null;
    if(p!==phase){ if(phase!==null && x(s)-x(start)>40){ el("text",{x:(x(start)+x(s))/2,y:M.top-10,"text-anchor":"middle",class:"phase"}).textContent=phase;
        el("line",{x1:x(start),x2:x(start),y1:M.top-6,y2:H-M.bottom,stroke:"#d5dae3","stroke-dasharray":"3,3"}); }
      phase=p; start=s; } }
  const g = el("g",{});
  if(layout){
    layout.order.forEach((b,k)=>{ const seg=layout.bases[k]; const pts=[];
      for(let i=0;i<seg.length;++i){ const s0=seg[i][0], s1=i+1<seg.length?seg[i+1][0]:b.last_step+1;
        pts.push(x(s0)+","+y(seg[i][1]+b.size), x(s1)+","+y(seg[i][1]+b.size)); }
      for(let i=seg.length-1;i>=0;--i){ const s0=seg[i][0], s1=i+1<seg.length?seg[i+1][0]:b.last_step+1;
        pts.push(x(s1)+","+y(seg[i][1]), x(s0)+","+y(seg[i][1])); }
      const p = el("polygon",{points:pts.join(" "),fill:colors[b.classIndex%colors.length],"fill-opacity":0.85,stroke:"#fff","stroke-width":0.3},g);
      hover(p,b); });
  } else {
    shown.forEach(b=>{ const r = el("rect",{x:x(b.first_step),width:Math.max(0.5,x(b.last_step+1)-x(b.first_step)),y:y(b.offset+b.size),
      height:Math.max(0.5,y(b.offset)-y(b.offset+b.size)),fill:colors[b.classIndex%colors.length],"fill-opacity":0.85,stroke:"#fff","stroke-width":0.3,
      class:"buffer"},g); hover(r,b); });
    if(!hide) el("line",{x1:M.left,x2:W-M.right,y1:y(D.arena_bytes),y2:y(D.arena_bytes),stroke:"#e15759","stroke-dasharray":"6,3"});
  }
  const px = x(D.peak_step+0.5);
  el("line",{x1:px,x2:px,y1:M.top,y2:H-M.bottom,stroke:"#e15759","stroke-width":1.2});
  const label = el("text",{x:px+6,y:M.top+14,class:"axis",fill:"#c0392b","font-weight":"600"});
  label.textContent="peak: step "+D.peak_step+", "+D.steps[D.peak_step];
  if(hide) el("text",{x:M.left+8,y:H-M.bottom-8,class:"axis"}).textContent="below "+(floor/GiB).toFixed(0)+" GiB: persistent state ("+human(persistentBytes)+" in all), not drawn";
  el("line",{x1:M.left,x2:M.left,y1:M.top,y2:H-M.bottom,stroke:"#8a93a6"});
  el("line",{x1:M.left,x2:W-M.right,y1:H-M.bottom,y2:H-M.bottom,stroke:"#8a93a6"});
}
document.querySelectorAll("input").forEach(i=>i.addEventListener("change",draw));
draw();
</script></body></html>
)PAGE";

}  // namespace

std::string memory_timeline_html(const StepPlan& plan, const std::string& title) {
  std::string data = memory_timeline_json(plan, title).dump();
  // Keep the data inert inside the script element.
  std::string safe;
  safe.reserve(data.size());
  for (char c : data) {
    if (c == '<') safe += "\\u003c";
    else safe += c;
  }
  std::string page = kPage;
  const std::string marker = "/*DATA*/";
  page.replace(page.find(marker), marker.size(), safe);
  return page;
}

void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream file(path, std::ios::binary);
  if (!file) fail(ErrorKind::input, "cannot write '" + path + "': check that the folder exists and is writable");
  file << text;
  if (!file.flush()) fail(ErrorKind::input, "writing '" + path + "' failed (disk full?)");
}

}  // namespace smelt
