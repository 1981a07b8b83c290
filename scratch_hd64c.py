import sys, torch
sys.path.insert(0, '.')
from benchmarks.ctas_sm90 import probe_cycles
torch.manual_seed(0)
for hd in (64, 128):
  for causal in (False, True):
    for sq in ((64, 128, 192) if hd == 64 else (64, 128)):
        cyc = {}
        for sk in (16384, 32768):
            q=torch.randn(1,sq,1,hd,device='cuda',dtype=torch.bfloat16); k=torch.randn(1,sk,1,hd,device='cuda',dtype=torch.bfloat16); v=torch.randn_like(k)
            cyc[sk] = probe_cycles(q, k, v, {}, False, 7, causal=causal)[0]
        print(f'hd{hd} causal={causal} seqlen_q={sq}: cycles per KV block {(cyc[32768]-cyc[16384])/128:.0f}', flush=True)
