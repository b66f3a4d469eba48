"""Two training steps of a small Keras model under Horovod, unmodified in the
way a user's script is: it calls hvd.DistributedOptimizer(opt) without
groups. Prints one line per rank saying whether groups=1 was bound in (by
dgcshim run --horovod-groups1) and the gradient count; the test reads them."""
import functools
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402

hvd.init()
bound = isinstance(hvd.DistributedOptimizer, functools.partial) and \
    hvd.DistributedOptimizer.keywords.get("groups") == 1
tf.random.set_seed(1)
model = tf.keras.Sequential([tf.keras.layers.Dense(256, activation="relu", input_shape=(128,)),
                             tf.keras.layers.Dense(10)])
opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01))
model.compile(optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
rng = np.random.RandomState(hvd.rank())
x = rng.rand(64, 128).astype("float32")
y = rng.randint(0, 10, size=64)
model.fit(x, y, batch_size=32, epochs=1, steps_per_epoch=2, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
print("keras_two_steps rank %d groups1 %d params %d steps 2" % (hvd.rank(), bound, model.count_params()), flush=True)
