# The training runs of the GPU check (issue 15 item 5), sourced by gpu_bundle.sh (the CPU's runs,
# made on the build machine) and gpu_check.sh (the GPU's): 200 steps of the default run in one
# precision, evaluated every 50 steps, one checkpoint at the end, the sample on (it runs the
# decoder's cached attention on the device), profiled (profile.json: the phases' times and where
# the steps read device memory back, issue 15 item 3).
#   moecore train configs/default.toml $(gpu_train_args PRECISION OUT_DIR) [--device cuda]
gpu_train_args() {
  echo --set train.max_steps=200 --set train.eval_every=50 --set train.save_every=0 \
    --set train.log_every=10 --set train.profile=true --set "train.precision=$1" \
    --set "train.out_dir=$2"
}
