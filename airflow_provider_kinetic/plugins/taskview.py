"""The Kinetic tab of a task instance as HTML: every value from a store or a user is
escaped, and the live parts are small fetch loops that write with ``textContent``.

The tab shows the newest try's job (or batch): its state, capacity and usage, its
output files, Cancel for a user allowed to (the job page's own POST), and one live
log: the job's, or for a batch the selected child's (``?child=N``; by default the
first child still running, else the first).  A batch's child rows refresh from
``/api/batches/{id}/children`` until the batch ends; each row links to its log.
"""

from __future__ import annotations

import urllib.parse
from html import escape
from typing import Any

from airflow_provider_kinetic.core.batch.progress import Summary
from airflow_provider_kinetic.plugins.jobs import JobRow
from airflow_provider_kinetic.plugins.tasks import TaskJob, TaskView
from airflow_provider_kinetic.plugins.views import (
    _link,
    _state,
    _usage_cells,
    page,
    progress_html,
)

TAB_SCRIPT = """
(function(){
  const logEl=document.getElementById('log');
  function show(el,state,reason){if(!el)return;el.textContent=state+(reason?' ('+reason+')':'');
    el.className='state '+state+(el.classList.contains('batch-state')?' batch-state':'');}
  async function getJson(url){
    const r=await fetch(url,{credentials:'same-origin',headers:{'Accept':'application/json'}});
    return r.ok?r.json():null;
  }
  if(logEl&&logEl.dataset.logUrl){
    const logUrl=logEl.dataset.logUrl;let offset=0;
    async function pollLog(){
      let done=false;
      try{const d=await getJson(logUrl+(logUrl.includes('?')?'&':'?')+'offset='+offset);
        if(d){if(d.text){logEl.append(document.createTextNode(d.text));
                logEl.scrollTop=logEl.scrollHeight;}
              offset=d.offset;done=d.terminal;
              if(logEl.dataset.stateOf){
                show(document.getElementById(logEl.dataset.stateOf),d.state,d.reason);}
              const why=document.getElementById('why-'+logEl.dataset.jobId);
              if(why){why.textContent=d.state==='PENDING'?(d.message||''):'';}
              const p=document.getElementById('progress');
              if(p&&d.progress&&p.dataset.jobId===logEl.dataset.jobId){
                const bar=p.querySelector('progress');
                if(d.progress.fraction!==null){bar.value=d.progress.fraction;bar.hidden=false;}
                p.querySelector('.progress-text').textContent=d.progress.text;}}}
      catch(e){}
      if(!done){setTimeout(pollLog,1000);}else{logEl.dataset.complete='true';}
    }
    pollLog();
  }
  const batch=document.querySelector('section[data-children-url]');
  if(batch){
    const body=batch.querySelector('tbody.children');
    async function pollChildren(){
      let done=false;
      try{const d=await getJson(batch.dataset.childrenUrl);
        if(d){show(batch.querySelector('.batch-state'),d.state,d.reason);done=d.terminal;
          const bp=batch.querySelector('.batch-progress');
          if(bp&&d.progress){bp.querySelector('progress').value=d.progress.fraction;
            bp.querySelector('.progress-text').textContent=d.progress.text;}
          for(const c of d.children){
            const row=body.querySelector("tr[data-child='"+c.child+"']");
            if(!row){body.dataset.stale='true';continue;}
            row.dataset.jobId=c.job_id;
            show(row.querySelector('.state'),c.state,c.reason);
            row.querySelector('.attempts').textContent=c.attempts==null?'':String(c.attempts);
            row.querySelector('.step').textContent=c.step||'';
            if(['SUCCEEDED','FAILED','CANCELLED','NOT_FOUND','PREEMPTED'].includes(c.state)){
              const b=row.querySelector('button.cancel');if(b){b.remove();}}
          }
          if(body.dataset.stale==='true'&&!done){location.reload();return;}}}
      catch(e){}
      batch.dataset.terminal=String(done);
      if(!done){setTimeout(pollChildren,2000);}
    }
    pollChildren();
  }
  document.addEventListener('click',async function(ev){
    const b=ev.target.closest('button.cancel');if(!b)return;
    if(!confirm('Cancel job '+b.dataset.jobId+'?'))return;
    b.disabled=true;
    const r=await fetch(b.dataset.url,{method:'POST',credentials:'same-origin',
                        headers:{'X-Kinetic-Action':'cancel'}});
    const out=document.getElementById('cancel-result');
    out.textContent=r.ok?'cancel requested: '+b.dataset.jobId
                        :'cancel failed: '+r.status+' '+(await r.text());
  });
})();
"""

#: States after which nothing changes (no Cancel, no refresh).
ENDED = frozenset({"SUCCEEDED", "FAILED", "CANCELLED", "NOT_FOUND", "PREEMPTED"})


def _q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def _cancel(base: str, conn_id: str, job_id: str, label: str) -> str:
    url = _link(base, f"/jobs/{_q(job_id)}/cancel", conn_id)
    return (
        f"<button class='cancel' data-job-id='{escape(job_id)}' "
        f"data-url='{escape(url)}'>{escape(label)}</button>"
    )


def _files(base: str, conn_id: str, job: TaskJob) -> str:
    kind = "batches" if job.row.batch else "jobs"
    path = f"/{kind}/{_q(job.row.job_id)}/files"
    items = "".join(
        f"<li><a href='{escape(_link(base, path, conn_id, name=f.name))}'>{escape(f.name)}</a>"
        f" ({f.size} bytes)</li>"
        for f in job.files
    )
    more = "<li>(more files not shown)</li>" if job.files_truncated else ""
    return f"<ul class='files'>{items or '<li>none</li>'}{more}</ul>"


def _facts(job: TaskJob) -> str:
    row = job.row
    usage = _usage_cells(row.usage, bool(row.usage and "cost" in row.usage))
    facts: list[tuple[str, str]] = [
        ("State", _state_span(row, job.state, job.reason)),
        ("Try", escape(str(job.try_number or ""))),
        ("Logical date", escape(job.logical_date or "")),
        ("Accelerator", escape(row.handle.accelerator)),
        ("Capacity", escape(usage.get("Capacity", ""))),
        ("Usage", f"<span class='usage-line'>{escape(job.usage_line)}</span>"),
        ("Backend", escape(row.handle.backend)),
        ("Start", escape(row.started)),
        ("End", escape(row.ended)),
        ("Output dir", f"<code>{escape(row.handle.output_dir or '')}</code>"),
    ]
    if job.slices and job.slices > 1:  # a multi-slice job (a JobSet): how many slices
        facts.insert(4, ("Slices", escape(str(job.slices))))
    if row.batch:
        facts.insert(1, ("Children", escape(str(job.total or len(job.children)))))
        facts.insert(2, ("Progress", _batch_progress(job.batch_progress)))
    if not row.batch:
        facts.insert(1, ("Progress", progress_html(job.progress, job.row.handle.job_id)))
        facts.insert(1, ("Waiting", _why(row)))
    return "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in facts)


def _batch_progress(summary: Summary | None) -> str:
    """A batch's bar and line (``3/6 children done (50%), ETA 4 min; child 3 step
    ...``), refreshed with its children."""
    value = f"{summary.fraction:.4f}" if summary is not None else "0"
    text = summary.describe() if summary is not None else ""
    return (
        f"<span class='batch-progress'><progress max='1' value='{value}'></progress> "
        f"<span class='progress-text'>{escape(text)}</span></span>"
    )


def _why(row: JobRow) -> str:
    """Why a waiting job waits: its status line's message (a queue position, the
    scheduler's and autoscaler's word, a flex-start request's state); the log feed
    keeps it current, and empties it once the job runs."""
    pending = row.report.status.value == "PENDING"
    text = row.report.message if pending else ""
    return f"<span id='why-{escape(row.job_id)}' class='why'>{escape(text or '')}</span>"


def _state_span(row: JobRow, state: str, reason: str | None) -> str:
    """A state the tab's script updates: by id (a job's, from its log feed) or by
    class (a batch's, from its children feed)."""
    target = f"id='state-{escape(row.job_id)}' class='state"
    if row.batch:
        target = "class='state batch-state"
    text = state + (f" ({reason})" if reason else "")
    return f"<span {target} {escape(state)}'>{escape(text)}</span>"


def _selected_child(job: TaskJob, child: int | None) -> dict[str, Any] | None:
    if not job.children:
        return None
    by_index = {c["child"]: c for c in job.children}
    if child is not None and child in by_index:
        return by_index[child]
    running = [c for c in job.children if c["state"] not in ENDED]
    return running[0] if running else job.children[0]


def _children(base: str, conn_id: str, view_url: str, job: TaskJob, can_cancel: bool) -> str:
    rows = []
    group = job.row.job_id
    steps = job.batch_progress.steps if job.batch_progress is not None else {}
    for c in job.children:
        job_id, index = str(c["job_id"]), int(c["child"])
        state = (
            f"<span class='state {escape(c['state'])}'>{escape(c['state'])}"
            + (f" ({escape(c['reason'])})" if c.get("reason") else "")
            + "</span>"
        )
        log = f"{view_url}{'&' if '?' in view_url else '?'}child={index}"
        page_url = _link(base, f"/jobs/{_q(job_id)}", conn_id, batch=group)
        cancel = (
            _cancel(base, conn_id, job_id, "Cancel")
            if can_cancel and c["state"] not in ENDED
            else ""
        )
        rows.append(
            f"<tr data-child='{index}' data-job-id='{escape(job_id)}'><td>{index}</td>"
            f"<td><a href='{escape(page_url)}'>{escape(job_id)}</a></td><td>{state}</td>"
            f"<td class='attempts'>{escape(str(c.get('attempts') or ''))}</td>"
            f"<td class='step'>{escape(steps.get(index, ''))}</td>"
            f"<td><a class='log-link' href='{escape(log)}'>log</a></td><td>{cancel}</td></tr>"
        )
    more = "<p>(more children not shown)</p>" if job.children_truncated else ""
    return (
        "<h3>Children</h3><table class='children'><thead><tr><th>Child</th><th>Job</th>"
        "<th>State</th><th>Attempts</th><th>Step</th><th>Log</th><th></th></tr></thead>"
        f"<tbody class='children'>{''.join(rows)}</tbody></table>{more}"
    )


def _log(base: str, conn_id: str, view: TaskView, child: int | None) -> str:
    """The one live log of the tab: the newest job's, or a batch's selected child's."""
    if not view.jobs:
        return ""
    job = view.jobs[0]
    if job.row.batch:
        chosen = _selected_child(job, child)
        if chosen is None:
            return "<h2>Log</h2><p id='no-log'>No child has started yet.</p>"
        job_id = str(chosen["job_id"])
        title = f"Log of child {chosen['child']} ({job_id})"
        url = _link(base, f"/api/jobs/{_q(job_id)}/log", conn_id, batch=job.row.job_id)
        state_of = ""
    else:
        job_id, title = job.row.job_id, f"Log of {job.row.job_id}"
        url = _link(base, f"/api/jobs/{_q(job_id)}/log", conn_id)
        state_of = f" data-state-of='state-{escape(job_id)}'"
    return (
        f"<h2 id='log-title'>{escape(title)}</h2>"
        f"<pre id='log' data-job-id='{escape(job_id)}' data-log-url='{escape(url)}'{state_of}>"
        "</pre>"
    )


def _earlier(base: str, conn_id: str, view: TaskView) -> str:
    if not view.earlier:
        return ""
    rows = []
    for try_number, r in view.earlier:
        href = (
            _link(base, "/", conn_id, group=r.job_id)
            if r.batch
            else _link(base, "/jobs/" + _q(r.job_id), conn_id)
        )
        rows.append(
            f"<tr><td>{escape(str(try_number or ''))}</td><td><a href='{escape(href)}'>"
            f"{escape(r.job_id)}</a></td><td>{_state(r)}</td><td>{escape(r.started)}</td></tr>"
        )
    return (
        "<h2>Earlier tries</h2><table id='earlier'><thead><tr><th>Try</th><th>Job</th>"
        f"<th>State</th><th>Start</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def task_tab(
    view: TaskView,
    base: str,
    conn_id: str,
    view_url: str,
    *,
    can_cancel: bool,
    child: int | None = None,
) -> str:
    """The tab: the newest try's jobs, the live log, earlier tries, and a connection
    switch (the tab's URL cannot name the task's connection: Airflow fills in only
    the task instance's ids)."""
    ids = f"{view.dag_id} / {view.run_id} / {view.task_id}" + (
        f" [{view.map_index}]" if view.map_index >= 0 else ""
    )
    sections = []
    for job in view.jobs:
        kind = "Batch" if job.row.batch else "Job"
        feed_url = _link(base, f"/api/batches/{_q(job.row.job_id)}/children", conn_id)
        feed = f" data-children-url='{escape(feed_url)}'" if job.row.batch else ""
        cancel = (
            _cancel(base, conn_id, job.row.job_id, "Cancel job")
            if can_cancel and not job.row.batch and not job.row.terminal
            else ""
        )
        children = _children(base, conn_id, view_url, job, can_cancel) if job.row.batch else ""
        sections.append(
            f"<section class='kinetic-job' data-job-id='{escape(job.row.job_id)}' "
            f"data-kind='{kind.lower()}'{feed}><h2>{kind} {escape(job.row.job_id)}</h2>"
            f"<table class='facts'>{_facts(job)}</table>{cancel}{children}"
            f"<h3>Output files</h3>{_files(base, conn_id, job)}</section>"
        )
    empty = (
        ""
        if view.jobs
        else f"<p id='no-jobs'>No kinetic job of this task instance in connection "
        f"<code>{escape(conn_id)}</code>.</p>"
    )
    switch = (
        "<form method='get' id='conn-form'><label>Connection <input name='conn_id' "
        f"value='{escape(conn_id)}' size='24'></label> <button>Show</button></form>"
    )
    return page(
        f"Kinetic: {ids}",
        f"<div id='kinetic-task' data-try='{escape(str(view.try_number or ''))}'>"
        f"<h1>Kinetic: {escape(ids)}</h1>{switch}<p id='cancel-result'></p>"
        f"{''.join(sections)}{empty}{_log(base, conn_id, view, child)}"
        f"{_earlier(base, conn_id, view)}</div><script>{TAB_SCRIPT}</script>",
    )
