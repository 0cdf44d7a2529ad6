# sourced: install the carried wheels for this python into /tmp/site
rm -rf /tmp/site; v=$(python3 -c 'import sys;print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/pure/*.whl .whl/$v/*.whl || return 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c 'import torch, transformers, sys; print(sys.version.split()[0], torch.__version__, transformers.__version__)'
python3 -c "import soundfile, soxr, fastapi, uvicorn, silero_vad, realtime.cli, realtime.server, pipeline.engine; print(\"imports ok\")" || return 1
