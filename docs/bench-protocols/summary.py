import glob
import json
import statistics
import sys

# Usage: summary.py [DIR [BEFORE AFTER]]: the runs' JSON in DIR, named KIND-BEFORE-N.json and
# KIND-AFTER-N.json (default /tmp/perf, before, after). Prints, per measurement with runs of
# both, every run's figure, the medians and the change.
directory = sys.argv[1] if len(sys.argv) > 1 else '/tmp/perf'
labels = sys.argv[2:4] if len(sys.argv) > 3 else ['before', 'after']


def kairos(mode):
    def value(d):
        for entry in d['modes']:
            if (entry.get('mode') or entry.get('name')) == mode:
                return entry['committed_per_sec']
        raise KeyError(mode)
    return value


MEASUREMENTS = [
    ('up', 'up', lambda d: d['tps']),
    ('dkv-inproc', 'dkv-inproc', lambda d: d['committed_per_sec']),
    ('dkv-grpc', 'dkv-grpc', lambda d: d['committed_per_sec']),
    ('kairos-none', 'kairos', kairos('none')),
    ('kairos-lease', 'kairos', kairos('lease')),
    ('chainify', 'chainify', lambda d: d['points'][0]['tps']),
]

for name, kind, value in MEASUREMENTS:
    runs = {}
    for which in labels:
        files = sorted(glob.glob(f'{directory}/{kind}-{which}-*.json'))
        runs[which] = [value(json.load(open(f))) for f in files]
    if not all(runs.values()):
        continue
    before, after = (statistics.median(runs[label]) for label in labels)
    print(name, labels[0], [round(x) for x in runs[labels[0]]], round(before),
          labels[1], [round(x) for x in runs[labels[1]]], round(after), f'{(after / before - 1) * 100:+.1f}%')
