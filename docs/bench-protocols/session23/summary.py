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
    for which in ['old','new']:
        vals=[val(kind,f) for f in sorted(glob.glob(f'docs/bench-protocols/session23/{kind}-{which}-*.json'))]
        row[which]=vals
    b,a=statistics.median(row['old']),statistics.median(row['new'])
    print(kind, 'old', [round(x) for x in row['old']], round(b), 'new', [round(x) for x in row['new']], round(a), f'{(a/b-1)*100:+.1f}%')
