import json,statistics,glob
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
    for which in ['before','after']:
        vals=[val(kind,f) for f in sorted(glob.glob(f'/tmp/perf/{kind}-{which}-*.json'))]
        row[which]=vals
    b,a=statistics.median(row['before']),statistics.median(row['after'])
    print(kind, 'before', [round(x) for x in row['before']], round(b), 'after', [round(x) for x in row['after']], round(a), f'{(a/b-1)*100:+.1f}%')
