import json,statistics,glob,sys
# Usage: summary.py [DIR [BEFORE AFTER]]: the runs' JSON in DIR, named KIND-BEFORE-N.json and
# KIND-AFTER-N.json (default /tmp/perf, before, after).
directory=sys.argv[1] if len(sys.argv)>1 else '/tmp/perf'
labels=sys.argv[2:4] if len(sys.argv)>3 else ['before','after']
def val(kind,f):
    d=json.load(open(f))
    if kind=='up': return d['tps']
    if kind.startswith('dkv'): return d['committed_per_sec']
    if kind=='kairos':
        m=d['modes']
        out={}
        for mode in m:
            name=mode.get('mode') or mode.get('name')
            out[name]=mode.get('committed_per_sec') or mode.get('median_committed_per_sec') or mode
        return out
    if kind=='chainify':
        return d
for kind in ['up','dkv-inproc','dkv-grpc']:
    row={}
    for which in labels:
        vals=[val(kind,f) for f in sorted(glob.glob(f'{directory}/{kind}-{which}-*.json'))]
        row[which]=vals
    b,a=statistics.median(row[labels[0]]),statistics.median(row[labels[1]])
    print(kind, labels[0], [round(x) for x in row[labels[0]]], round(b), labels[1], [round(x) for x in row[labels[1]]], round(a), f'{(a/b-1)*100:+.1f}%')
