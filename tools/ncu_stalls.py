import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
# skip a leading "Kernel Name" line
while rows and (not rows[0] or rows[0][0].startswith('Kernel') or len(rows[0]) < 5): rows = rows[1:]
hdr = rows[0]; data = rows[1:]
stall = [i for i, h in enumerate(hdr) if h.startswith('stall_') or 'Stall' in h]
src = next(i for i, h in enumerate(hdr) if h.lower() in ('source', 'sass'))
tot = collections.Counter(); per_line = []
for r in data:
    if len(r) != len(hdr): continue
    s = 0
    for i in stall:
        try: v = float(r[i].replace(',', '') or 0)
        except ValueError: v = 0
        tot[hdr[i]] += v; s += v
    per_line.append((s, r[src][:90], {hdr[i]: r[i] for i in stall if r[i] not in ('0', '', '0.0')}))
print('columns:', len(hdr), 'lines:', len(data))
for k, v in tot.most_common(25): print(f'{k:50s} {v:12.0f}')
per_line.sort(key=lambda x: -x[0])
for s, t, d in per_line[:40]: print(f'{s:8.0f} {t}  {dict(list(d.items())[:6])}')
