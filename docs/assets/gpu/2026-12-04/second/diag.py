"""Why is KV-cache decoding slow on CUDA? Times eager and compiled per-token decoding, counts
recompilations, and profiles 20 compiled cached steps."""
import sys, time, torch, torch._dynamo
from torch._dynamo.utils import counters
sys.path.insert(0, '.')
from model import GPT, GPTConfig, KVCache
torch.manual_seed(0)
cfg = GPTConfig(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304, query='identity')
base = GPT(cfg, verbose=False).cuda().to(torch.bfloat16).eval()
prompt = torch.randint(50304, (1, 16), device='cuda')

def timed(model, n, use_cache):
    model.generate(prompt, 4, temperature=0.0, use_cache=use_cache)
    torch.cuda.synchronize(); t = time.perf_counter()
    model.generate(prompt, n, temperature=0.0, use_cache=use_cache)
    torch.cuda.synchronize(); return n / (time.perf_counter() - t)

for uc in (True, False):
    print(f"eager use_cache={uc}: {timed(base, 200, uc):.1f} tokens/s", flush=True)
for dyn in (True, None):
    torch._dynamo.reset(); counters.clear()
    m = GPT(cfg, verbose=False).cuda().to(torch.bfloat16).eval()
    m.load_state_dict(base.state_dict())
    m.compile(dynamic=dyn)
    t0 = time.perf_counter()
    for uc in (True, False):
        print(f"compiled dynamic={dyn} use_cache={uc}: {timed(m, 200, uc):.1f} tokens/s "
              f"(frames compiled so far {counters['stats'].get('unique_graphs', 0)}, "
              f"{time.perf_counter() - t0:.0f} s)", flush=True)
    print('recompile reasons:', dict(counters['recompiles']) if 'recompiles' in counters else None)
    print('graph breaks:', dict(counters['graph_break']), flush=True)
    if dyn:
        from torch.profiler import profile, ProfilerActivity
        cache = KVCache(cfg, 1, 'cuda', torch.bfloat16)
        with torch.no_grad():
            m(prompt, cache=cache)
            for _ in range(3): m(prompt[:, :1], cache=cache)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
                for _ in range(20): m(prompt[:, :1], cache=cache)
                torch.cuda.synchronize()
        print(p.key_averages().table(sort_by='cpu_time_total', row_limit=18), flush=True)
