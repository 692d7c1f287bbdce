#!/bin/sh
# gpusched attempt of E1/87-glue-tvt_qnli; submitted with: sbatch --parsable sbatch.sh
#SBATCH --job-name=gpusched-E1-87-glue-tvt_qnli
#SBATCH --output=/shared/logs/E1/87-glue-tvt_qnli/1-A/slurm-%j.out
#SBATCH --open-mode=append
#SBATCH --chdir=/shared/project
#SBATCH --comment=gpusched:t0k3n-87
#SBATCH --no-requeue
#SBATCH --gres=gpu:1
#SBATCH --partition=gpu
#SBATCH --time=02:00:00
#SBATCH --mem=16G
#SBATCH --qos high
export GPUSCHED_JOB_ID=E1/87-glue-tvt_qnli
export NOTE='it'"'"'s got spaces & $dollars'
export GPUSCHED_TOKEN=t0k3n-87
exec sh /opt/gpusched/wrap.sh /shared/logs/E1/87-glue-tvt_qnli/1-A file
