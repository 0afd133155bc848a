"""The web dashboard's static files (`static/`: index.html, ES modules, CSS), served by
`gpuyard.platform.api.dashboard`. Plain files, no build step, no CDN: machines may be offline."""
