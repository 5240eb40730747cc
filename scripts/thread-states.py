#!/usr/bin/python3
"""Where each thread of a process spends its wall time over probed windows:
running, runnable (preempted or woken, waiting for a CPU; the woken part
and its mean wake-to-run time apart) and sleeping, and
on what it sleeps (the kernel wait and the first project frames of the
stack it switched out with). BENCHMARKS.md, "Four and eight steps in flight
over shm: where the threads wait (issue 13, eleventh pass)".

Record (per process: --switch-events gives every switch in and out of the
process's threads; the sched_switch stack says why a thread left the CPU):

  perf probe -x build/ect -a 'pr=push_round' -a 'prr=push_round%return'
  perf record --switch-events -e 'sched:sched_switch/call-graph=dwarf,stack-size=8192/' \\
      -e sched:sched_wakeup -e probe_ect:pr -e probe_ect:prr__return -- \\
      build/ect bench push --sizes 64KiB --steps 32 --inflight 4 --transport shm --seconds 1
  perf script --show-switch-events -F comm,pid,tid,cpu,time,event,trace,ip,sym,dso | \\
      scripts/thread-states.py probe_ect:pr probe_ect:prr__return

The windows run from each ENTRY event to the next RETURN event; the first
window (the bench's untimed warm-up round) is left out. Percentages are of
the windows' total time.
"""
import collections
import re
import sys

HDR = re.compile(r'^\s*(\S.*?)\s+(\d+)/(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(.*)$')
FRAME = re.compile(r'^\s+([0-9a-f]+)\s+(.+?)\s+\((.*)\)\s*$')
KV = re.compile(r'(\w+)=(\S+)')
PROJECT = ('libectransfer', '/ect')
WAITS = (('futex', 'futex'), ('epoll', 'epoll'), ('poll', 'poll'), ('nanosleep', 'sleep'),
         ('recv', 'recv'), ('read', 'recv'), ('send', 'send'), ('write', 'send'),
         ('page_fault', 'fault'), ('mprotect', 'mprotect'))


def read_events(lines):
    events, cur = [], None
    for line in lines:
        m = HDR.match(line)
        if m:
            _, _, tid, _, t, rest = m.groups()
            if rest.startswith('PERF_RECORD_SWITCH'):
                ev = ('OUT' if ' OUT' in rest else 'IN') + ('P' if 'preempt' in rest else '')
                events.append(dict(tid=int(tid), t=float(t), ev=ev, rest='', st=[]))
                cur = None
                continue
            mm = re.match(r'(\S+?):?\s+(.*)$', rest + ' ')
            cur = dict(tid=int(tid), t=float(t), ev=mm.group(1), rest=mm.group(2), st=[])
            events.append(cur)
            continue
        f = FRAME.match(line)
        if f and cur is not None:
            cur['st'].append((f.group(2), f.group(3)))
    return events


def windows(events, entry, ret):
    wins, start = [], None
    for e in events:
        if e['ev'] == entry:
            start = e['t']
        elif e['ev'] == ret and start is not None:
            wins.append((start, e['t']))
            start = None
    return wins[1:]


def why(stack, depth):
    """The kernel wait and the first project frames of a switch-out stack."""
    kind = 'other'
    for sym, dso in stack:
        if 'kernel' not in dso:
            continue
        hit = next((k for pat, k in WAITS if pat in sym), None)
        if hit:
            kind = hit
            break
    proj = [sym for sym, dso in stack if any(p in dso for p in PROJECT)]
    return kind, proj[:depth], proj[-1] if proj else '?'


def main():
    entry, ret = sys.argv[1], sys.argv[2]
    depth = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    events = read_events(sys.stdin)
    wins = windows(events, entry, ret)
    total = sum(b - a for a, b in wins)
    if not total:
        sys.exit('no windows between %s and %s' % (entry, ret))

    def within(a, b):
        return sum(max(0.0, min(b, w1) - max(a, w0)) for w0, w1 in wins)

    def inside(t):
        return any(w0 <= t <= w1 for w0, w1 in wins)

    th = collections.defaultdict(lambda: dict(run=0.0, runq=0.0, woke=0.0, sleep=0.0, sleeps=0,
                                              preempted=0, wakes=0,
                                              roots=collections.Counter(),
                                              site_t=collections.Counter(),
                                              site_n=collections.Counter(),
                                              wakers=collections.Counter()))
    state, site = {}, {}

    def close(tid, t):
        if tid in state:
            since, kind, where = state[tid]
            dt = within(since, t)
            th[tid][kind] += dt
            if kind == 'sleep':
                th[tid]['site_t'][where] += dt
            if kind == 'runq' and where == 'woken':
                th[tid]['woke'] += dt

    for e in events:
        ev, t, tid = e['ev'], e['t'], e['tid']
        if ev == 'sched:sched_switch':
            d = dict(KV.findall(e['rest']))
            if int(d.get('prev_pid', -1)) == tid:
                kind, proj, root = why(e['st'], depth)
                th[tid]['roots'][root] += 1
                site[tid] = kind + ' ' + '<'.join(proj)
        elif ev in ('IN', 'INP'):
            close(tid, t)
            state[tid] = (t, 'run', None)
        elif ev == 'OUTP':
            close(tid, t)
            state[tid] = (t, 'runq', None)
            th[tid]['preempted'] += inside(t)
        elif ev == 'OUT':
            close(tid, t)
            where = site.pop(tid, 'unknown')
            state[tid] = (t, 'sleep', where)
            if inside(t):
                th[tid]['sleeps'] += 1
                th[tid]['site_n'][where] += 1
        elif ev == 'sched:sched_wakeup':
            d = dict(KV.findall(e['rest']))
            woken = int(d.get('pid', -1))
            if woken in state and state[woken][1] == 'sleep':
                close(woken, t)
                state[woken] = (t, 'runq', 'woken')
                if inside(t):
                    th[woken]['wakers'][tid] += 1
                    th[woken]['wakes'] += 1

    print('windows: %d, %.1f ms' % (len(wins), total * 1e3))
    for tid, s in sorted(th.items(), key=lambda kv: -kv[1]['run']):
        if s['run'] < 0.002 * total:
            continue
        root = s['roots'].most_common(1)[0][0] if s['roots'] else '?'
        print('%7d %-22s run %5.1f%%  runnable %5.1f%% (of it woken %5.1f%%, mean %.1f us)  '
              'sleep %5.1f%%  sleeps %d  preempted %d' % (
                  tid, root[:22], 100 * s['run'] / total, 100 * s['runq'] / total,
                  100 * s['woke'] / total, 1e6 * s['woke'] / max(s['wakes'], 1),
                  100 * s['sleep'] / total, s['sleeps'], s['preempted']))
        for where, dt in s['site_t'].most_common(5):
            if dt >= 0.005 * total:
                print('        sleep %5.1f%%  n=%5d  %s' % (100 * dt / total, s['site_n'][where],
                                                         where[:160]))
        if s['wakers']:
            print('        woken by: ' + ', '.join('%d x%d' % kv for kv in s['wakers'].most_common(5)))


if __name__ == '__main__':
    main()
